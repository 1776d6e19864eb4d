"""Read samples from an HDF5 file; each worker opens the file on first use (the dataset pickles a path)."""

import os
import shutil
import tempfile

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, path):
        self.path, self.file = path, None
        with h5py.File(path, "r") as f:
            self.n = len(f["x"])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.file is None:  # first use in this process
            self.file = h5py.File(self.path, "r")
        return torch.from_numpy(self.file["x"][i])


def main():
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "samples.h5")
    try:
        with h5py.File(path, "w") as f:
            f["x"] = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
        total = 0.0
        for batch in DataLoader(Samples(path), batch_size=16, num_workers=2):
            total += batch.sum().item()
        assert total == sum(range(64 * 3)), total
        print("sum", total)
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
