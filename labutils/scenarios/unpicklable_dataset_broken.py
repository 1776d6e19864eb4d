"""Read samples from an index file; the dataset opens the file once, in __init__."""

import os
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset


class IndexedSamples(Dataset):
    def __init__(self, index_path):
        self.index = open(index_path)
        self.offsets = []
        pos = 0
        for line in self.index:
            self.offsets.append(pos)
            pos += len(line)

    def __len__(self):
        return len(self.offsets)

    def __getitem__(self, i):
        self.index.seek(self.offsets[i])
        values = [float(v) for v in self.index.readline().split()]
        return torch.tensor(values)


def main():
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "index.txt")
    with open(path, "w") as fh:
        for i in range(64):
            fh.write(f"{i} {i * 0.5} {i * 0.25}\n")
    try:
        total = 0.0
        for batch in DataLoader(IndexedSamples(path), batch_size=16, num_workers=2):
            total += batch.sum().item()
        print("sum", total)
    finally:
        os.remove(path)
        os.rmdir(folder)


if __name__ == "__main__":
    main()
