"""Preprocess shards in a concurrent.futures.ProcessPoolExecutor: each job builds its own DataLoader.

One shard holds a truncated record; the decoder (a stand-in for a C library) segfaults on it inside a
worker of the job's loader. The job re-raises PyTorch's error and the pool hands it back to the script.
"""

from concurrent.futures import ProcessPoolExecutor

from torch.utils.data import DataLoader
from tree_records import Records, make_records

SHARDS = [None, 5]  # shard 1 has a bad record at index 5


def summarise(bad):
    total = 0.0
    for batch in DataLoader(Records(make_records(n=24, bad=bad)), batch_size=4, num_workers=2):
        total += batch.mean().item()
    return total


if __name__ == "__main__":
    with ProcessPoolExecutor(max_workers=1) as pool:
        means = list(pool.map(summarise, SHARDS))
    print("shard means", [round(m, 3) for m in means])
