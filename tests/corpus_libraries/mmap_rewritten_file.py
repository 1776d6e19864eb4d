# Modelled on https://github.com/brainiak/rt-cloud/pull/17 (a mapped file overwritten in place)
"""Features read through np.load(mmap_mode='r') while a preprocessing step rewrites the same .npy file."""

import os
import shutil
import tempfile

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Features(Dataset):
    def __init__(self, path):
        self.path, self.data = path, None

    def __len__(self):
        return 2048

    def __getitem__(self, i):
        if self.data is None:
            self.data = np.load(self.path, mmap_mode="r")
        return torch.from_numpy(np.array(self.data[i]))


if __name__ == "__main__":
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "features.npy")
    try:
        np.save(path, np.ones((2048, 2048), dtype=np.float32))
        for k, _batch in enumerate(DataLoader(Features(path), batch_size=32, num_workers=2)):
            if k == 1:  # both workers have mapped it
                np.save(path, np.ones((64, 2048), dtype=np.float32))  # the rewrite starts with a truncation
    finally:
        shutil.rmtree(folder)
