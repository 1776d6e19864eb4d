"""Read each sample's four chunks in parallel: every worker gives its reads a pool of 8 threads.

Under a limit of 18 tasks (processes and threads, as the kernel counts them) the two workers fork fine,
but their read threads do not fit: the kernel refuses a thread, not a process.
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.utils.data import DataLoader, Dataset

READ_THREADS = int(os.environ.get("READ_THREADS", "8"))


def read_chunk(i, part):
    time.sleep(0.005)  # a read that waits on storage: the pool starts all its threads
    return [i * 4 + part]


class Chunked(Dataset):
    def __init__(self):
        self.pool = None  # made in each worker on first use

    def __len__(self):
        return 32

    def __getitem__(self, i):
        if READ_THREADS <= 1:
            parts = [read_chunk(i, p) for p in range(4)]
        else:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(max_workers=READ_THREADS)
            futures = [self.pool.submit(read_chunk, i, p) for p in range(READ_THREADS)]
            parts = [f.result() for f in futures][:4]
        return torch.tensor(sum(parts, []))


if __name__ == "__main__":
    loader = DataLoader(Chunked(), batch_size=4, num_workers=2)
    rows = [r for batch in loader for r in batch.tolist()]
    assert rows == [[i * 4 + p for p in range(4)] for i in range(32)], rows[:3]
    print("loaded", len(rows), "samples")
