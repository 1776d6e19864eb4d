"""A worker that ends with exit code 0 (a library's os._exit) while it hands a batch over.

The timing is staged (the worker's side of the fd hand-over is wrapped); the death and the main
process's bare EOFError in rebuild_storage_fd are real.
"""

import multiprocessing.reduction
import os

import torch
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((4,), float(i))


def init(worker_id):
    if worker_id == 0:
        multiprocessing.reduction.send_handle = lambda conn, fd, pid: os._exit(0)


if __name__ == "__main__":
    total = 0.0
    for batch in DataLoader(Rows(), batch_size=2, num_workers=2, worker_init_fn=init):
        total += float(batch.sum())
    print("sum", total)
