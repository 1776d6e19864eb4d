# Modelled on https://github.com/ACEsuit/mace/pull/117 (the h5py.File as a property, opened on first access)
"""The HDF5 file is a property opened on first access and left out of the pickle, under spawn."""

import multiprocessing
import os
import shutil
import tempfile

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Configurations(Dataset):
    def __init__(self, path):
        self.path, self._file = path, None
        with h5py.File(path, "r") as f:
            self.n = len(f["energy"])

    @property
    def file(self):
        if self._file is None:
            self._file = h5py.File(self.path, "r")
        return self._file

    def __getstate__(self):
        return {**self.__dict__, "_file": None}

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(float(self.file["energy"][i]))


if __name__ == "__main__":
    multiprocessing.set_start_method("spawn")
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "train.h5")
    try:
        with h5py.File(path, "w") as f:
            f["energy"] = np.arange(48, dtype=np.float64)
        ds = Configurations(path)
        ds[0]  # the main process reads one sample first: the file is open here too
        total = sum(float(b.sum()) for b in DataLoader(ds, batch_size=8, shuffle=True, num_workers=2))
        assert total == sum(range(48)), total
        print("energy", total)
    finally:
        shutil.rmtree(folder)
