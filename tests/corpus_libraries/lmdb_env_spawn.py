# Modelled on https://github.com/pytorch/vision/issues/689 (LSUN's lmdb Environment, num_workers > 0 on Windows)
"""An LMDB image store opened in the dataset's __init__, loaded by spawn workers."""

import multiprocessing
import os
import shutil
import tempfile

import lmdb
import torch
from torch.utils.data import DataLoader, Dataset


class LmdbImages(Dataset):
    def __init__(self, root):
        self.env = lmdb.open(root, readonly=True, lock=False)
        with self.env.begin() as txn:
            self.length = txn.stat()["entries"]

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        with self.env.begin() as txn:
            return torch.tensor(list(txn.get(b"%05d" % i)), dtype=torch.float32)


if __name__ == "__main__":
    multiprocessing.set_start_method("spawn")  # Windows' and macOS's only way
    root = tempfile.mkdtemp()
    try:
        with lmdb.open(root, map_size=1 << 22) as env, env.begin(write=True) as txn:
            for i in range(40):
                txn.put(b"%05d" % i, bytes([i] * 8))
        for _batch in DataLoader(LmdbImages(root), batch_size=8, shuffle=True, num_workers=2):
            pass
    finally:
        shutil.rmtree(root)
    print("done", os.getpid())
