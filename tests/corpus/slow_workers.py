"""A slow loader whose workers record their pids (so an operator can find them), then load for a while."""

import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


def note_pid(worker_id):
    folder = os.environ.get("PID_NOTES")
    if folder:
        with open(os.path.join(folder, f"{os.getpid()}"), "w") as fh:
            fh.write(str(worker_id))


class Slow(Dataset):
    def __len__(self):
        return 600

    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.tensor(i)


if __name__ == "__main__":
    n = 0
    for batch in DataLoader(Slow(), batch_size=4, num_workers=2, worker_init_fn=note_pid):
        n += len(batch)
    print("loaded", n, file=sys.stderr)
