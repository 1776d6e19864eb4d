"""Decodes records with a native call; one record is truncated. No workers: num_workers=0."""

import ctypes

import torch
from torch.utils.data import DataLoader, Dataset


class Records(Dataset):
    def __init__(self):
        self.sizes = [16] * 10 + [0] + [16] * 5

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, i):
        if self.sizes[i] == 0:
            ctypes.string_at(0)  # the decoder reads through a null pointer
        return torch.zeros(self.sizes[i])


if __name__ == "__main__":
    for batch in DataLoader(Records(), batch_size=4, num_workers=0):
        print(batch.shape)
