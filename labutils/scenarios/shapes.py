"""A tiny synthetic image dataset kept in an importable module (used by a scenario's fixed script)."""

import torch
from torch.utils.data import Dataset


class Shapes(Dataset):
    """Squares of growing brightness, with a label that says whether the square is bright."""

    def __init__(self, n=64, size=16):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        level = i / self.n
        return torch.full((1, self.size, self.size), level), int(level > 0.5)
