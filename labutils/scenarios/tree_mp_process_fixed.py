"""A launcher that trains in a multiprocessing.Process(target=train) and exits with the child's status.

Every record is whole, so the child trains to the end and exits 0.
"""

import multiprocessing
import sys

from torch.utils.data import DataLoader
from tree_records import CheckedRecords, make_records

BAD = None


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
