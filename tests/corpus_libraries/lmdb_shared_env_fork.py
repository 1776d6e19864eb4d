# Modelled on https://github.com/baudm/parseq/issues/6 (one Environment shared by every worker: "works for fork")
"""A text-recognition style LMDB dataset: the Environment is opened once and shared by forked workers."""

import shutil
import tempfile

import lmdb
import torch
from torch.utils.data import DataLoader, Dataset


class LabelStore(Dataset):
    def __init__(self, root):
        self.env = lmdb.open(root, readonly=True, readahead=False, meminit=False)
        with self.env.begin() as txn:
            self.n = int(txn.get(b"num-samples"))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        txn = self.env.begin()  # a new read transaction per sample, never closed by the dataset
        return torch.tensor(len(txn.get(b"label-%09d" % i)))


if __name__ == "__main__":
    root = tempfile.mkdtemp()
    try:
        with lmdb.open(root, map_size=1 << 24) as env, env.begin(write=True) as txn:
            txn.put(b"num-samples", b"800")
            for i in range(800):
                txn.put(b"label-%09d" % i, b"word%d" % i)
        total = 0
        for batch in DataLoader(LabelStore(root), batch_size=16, num_workers=2, multiprocessing_context="fork"):
            total += int(batch.sum())
        print("characters", total)
    finally:
        shutil.rmtree(root)
