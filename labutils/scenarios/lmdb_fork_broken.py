"""Read feature vectors from an LMDB database; the dataset opens the environment once, in __init__."""

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
        self.env = lmdb.open(path, readonly=True)  # opened here: every forked worker shares it
        with self.env.begin() as txn:
            self.n = txn.stat()["entries"]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.env.begin() as txn:
            return torch.from_numpy(np.frombuffer(txn.get(str(i).encode()), dtype=np.float32).copy())


def main():
    folder = tempfile.mkdtemp()
    try:
        write_database(os.path.join(folder, "features.lmdb"))
        total = 0.0
        # LMDB's own rule is about fork: the loader pins it (under spawn this dataset cannot be pickled)
        for batch in DataLoader(Features(os.path.join(folder, "features.lmdb")), batch_size=16, num_workers=2,
                                multiprocessing_context="fork"):
            total += batch[:, 0].sum().item()
        print("sum", total)
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
