"""A launcher that starts its trainer in a child process, logs the child's exit code, and exits 0.

The child's DataLoader fails (a worker raises on a truncated record) and the child dies of it, but this
script reports the exit code and exits 0 anyway: a run that "succeeded" while its training failed.
"""

import multiprocessing

from torch.utils.data import DataLoader
from tree_records import CheckedRecords, make_records

BAD = 13


def train():
    total = 0.0
    for batch in DataLoader(CheckedRecords(make_records(bad=BAD)), batch_size=4, num_workers=2):
        total += batch.mean().item()
    print(f"mean {total:.3f}", flush=True)


if __name__ == "__main__":
    child = multiprocessing.Process(target=train, name="trainer")
    child.start()
    child.join()
    print("trainer finished with exit code", child.exitcode)
