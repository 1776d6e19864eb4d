"""A launcher that trains in a multiprocessing.Process(target=train) and exits with the child's status.

The Dataset refuses a truncated record with a Python error in a worker: the child (not this script's
main process) gets PyTorch's re-raised error, prints its traceback and exits 1.
"""

import multiprocessing
import sys

from torch.utils.data import DataLoader
from tree_records import CheckedRecords, make_records

BAD = 29


def train():
    total = 0.0
    for batch in DataLoader(CheckedRecords(make_records(bad=BAD)), batch_size=8, num_workers=2):
        total += batch.mean().item()
    print(f"mean {total:.3f}", flush=True)


if __name__ == "__main__":
    child = multiprocessing.Process(target=train, name="trainer")
    child.start()
    child.join()
    print("trainer exit code", child.exitcode)
    sys.exit(child.exitcode)
