"""Read feature vectors from an LMDB database; each worker opens its own environment on first use."""

import os
import shutil
import tempfile

import lmdb
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

ROWS = 1000


def write_database(path):
    with lmdb.open(path, map_size=1 << 26) as env, env.begin(write=True) as txn:
        for i in range(ROWS):
            txn.put(str(i).encode(), np.full(4, i, dtype=np.float32).tobytes())


class Features(Dataset):
    def __init__(self, path):
        self.path, self.env = path, None
        with lmdb.open(path, readonly=True) as env, env.begin() as txn:  # closed again before any fork
            self.n = txn.stat()["entries"]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.env is None:  # first use in this process: its own environment
            self.env = lmdb.open(self.path, readonly=True)
        with self.env.begin() as txn:
            return torch.from_numpy(np.frombuffer(txn.get(str(i).encode()), dtype=np.float32).copy())


def main():
    folder = tempfile.mkdtemp()
    try:
        write_database(os.path.join(folder, "features.lmdb"))
        total = 0.0
        for batch in DataLoader(Features(os.path.join(folder, "features.lmdb")), batch_size=16, num_workers=2,
                                multiprocessing_context="fork"):
            total += batch[:, 0].sum().item()
        assert total == ROWS * (ROWS - 1) / 2, total
        print("sum", total)
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
