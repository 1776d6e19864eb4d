"""Load samples from files, dropping the ones that are missing before training starts."""

import os
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset


def read_sample(path):
    with open(path) as fh:
        return torch.tensor([float(v) for v in fh.read().split()])


class Files(Dataset):
    def __init__(self, paths):
        self.paths = [p for p in paths if os.path.exists(p)]
        self.missing = len(paths) - len(self.paths)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return read_sample(self.paths[i])


if __name__ == "__main__":
    folder = tempfile.mkdtemp()
    paths = []
    for i in range(40):
        path = os.path.join(folder, f"sample_{i}.txt")
        if i != 23:
            with open(path, "w") as fh:
                fh.write(f"{i} {i + 1} {i + 2}")
        paths.append(path)
    try:
        data = Files(paths)
        print("missing files:", data.missing)
        total = 0.0
        for batch in DataLoader(data, batch_size=4, num_workers=2):
            total += batch.sum().item()
        print("total", total)
    finally:
        for p in paths:
            if os.path.exists(p):
                os.remove(p)
        os.rmdir(folder)
