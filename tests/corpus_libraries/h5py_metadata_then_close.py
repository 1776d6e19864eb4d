# Modelled on https://github.com/qiuqiao/SOFA/issues/18 (read the metadata, close the file, reopen in each worker)
"""The main process reads the HDF5 metadata and closes the file; each spawn worker opens its own."""

import multiprocessing
import os
import shutil
import tempfile

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Frames(Dataset):
    def __init__(self, path):
        self.path, self.h5 = path, None
        with h5py.File(path, "r") as f:
            self.label_types = list(f.attrs["label_types"])
            self.n = len(f["frames"])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.h5 is None:
            self.h5 = h5py.File(self.path, "r")
        return torch.from_numpy(self.h5["frames"][i])


if __name__ == "__main__":
    multiprocessing.set_start_method("spawn")
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "frames.h5")
    try:
        with h5py.File(path, "w") as f:
            f["frames"] = np.ones((40, 6), dtype=np.float32)
            f.attrs["label_types"] = ["sp", "ap"]
        total = sum(float(b.sum()) for b in DataLoader(Frames(path), batch_size=8, num_workers=2))
        assert total == 240, total
        print("frames", total)
    finally:
        shutil.rmtree(folder)
