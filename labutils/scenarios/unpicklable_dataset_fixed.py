"""Read samples from an index file; each worker opens its own handle on first use."""

import os
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset


class IndexedSamples(Dataset):
    def __init__(self, index_path):
        self.index_path = index_path
        self.index = None
        self.offsets = []
        pos = 0
        with open(index_path) as fh:
            for line in fh:
                self.offsets.append(pos)
                pos += len(line)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["index"] = None  # a file handle stays in the process that opened it
        return state

    def __len__(self):
        return len(self.offsets)

    def __getitem__(self, i):
        if self.index is None:
            self.index = open(self.index_path)
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
