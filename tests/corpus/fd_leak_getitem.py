"""Reads one small text file per sample (a caption) and forgets to close it."""

import os
import sys
import tempfile

from torch.utils.data import DataLoader, Dataset


class Notes(Dataset):
    def __init__(self, folder, n):
        self.paths = []
        for i in range(n):
            path = os.path.join(folder, f"note{i}.txt")
            with open(path, "w") as fh:
                fh.write(str(i))
            self.paths.append(path)
        self.handles = []

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        fh = open(self.paths[i])
        self.handles.append(fh)  # kept "for later": never closed
        return fh.read()


def main():
    with tempfile.TemporaryDirectory() as folder:
        data = Notes(folder, 400)
        seen = 0
        for batch in DataLoader(data, batch_size=8, num_workers=2, multiprocessing_context="fork"):
            seen += len(batch)
        print("read", seen, file=sys.stderr)


if __name__ == "__main__":
    main()
