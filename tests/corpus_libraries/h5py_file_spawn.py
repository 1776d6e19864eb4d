# Modelled on https://github.com/h5py/h5py/issues/1512 (TypeError: h5py objects cannot be pickled, Windows)
"""Edge labels kept in an HDF5 file that the dataset opens in __init__, under spawn."""

import multiprocessing
import os
import shutil
import tempfile

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class EdgeLabels(Dataset):
    def __init__(self, path):
        self.h5 = h5py.File(path, "r")
        self.labels = self.h5["label"]

    def __len__(self):
        return self.labels.shape[0]

    def __getitem__(self, i):
        return torch.from_numpy(self.labels[i].astype(np.float32))


if __name__ == "__main__":
    multiprocessing.set_start_method("spawn")
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "labels.h5")
    try:
        with h5py.File(path, "w") as f:
            f["label"] = np.random.default_rng(0).integers(0, 2, (32, 4, 4))
        for _batch in DataLoader(EdgeLabels(path), batch_size=4, num_workers=2):
            pass
    finally:
        shutil.rmtree(folder)
