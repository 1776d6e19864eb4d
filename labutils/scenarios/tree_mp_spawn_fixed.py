"""Train in a process started by torch.multiprocessing.spawn; it loads records with 2 workers.

Every record is whole (the copy was checked), so the decoder never sees a short one.
"""

import torch.multiprocessing as mp
from torch.utils.data import DataLoader
from tree_records import Records, make_records


def train(rank, bad):
    total = 0.0
    loader = DataLoader(Records(make_records(bad=bad)), batch_size=8, num_workers=2)
    for batch in loader:
        total += batch.mean().item()
    print(f"rank {rank}: mean {total:.3f}", flush=True)


if __name__ == "__main__":
    mp.spawn(train, args=(None,), nprocs=1, join=True)
