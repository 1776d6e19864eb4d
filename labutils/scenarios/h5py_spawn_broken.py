"""Read samples from an HDF5 file; the dataset opens the file once, in __init__."""

import os
import shutil
import tempfile

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, path):
        self.file = h5py.File(path, "r")  # opened here: spawn must pickle it to send the dataset
        self.x = self.file["x"]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i])


def main():
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "samples.h5")
    try:
        with h5py.File(path, "w") as f:
            f["x"] = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
        total = 0.0
        for batch in DataLoader(Samples(path), batch_size=16, num_workers=2):
            total += batch.sum().item()
        print("sum", total)
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
