"""Train on rows of a memory-mapped data file; the sync job writes a new file and renames it into place."""

import os
import shutil
import tempfile

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

ROWS, COLS = 4096, 1024  # float32: 16 MiB


class Rows(Dataset):
    def __init__(self, path):
        self.path, self.data = path, None

    def __len__(self):
        return ROWS

    def __getitem__(self, i):
        if self.data is None:  # each worker maps the file on first use
            self.data = np.memmap(self.path, dtype=np.float32, mode="r", shape=(ROWS, COLS))
        return torch.from_numpy(np.array(self.data[i])), i


def sync_new_version(path):
    """Write the new version beside the old one, then rename it over: a mapped file is never cut short."""
    partial = path + ".partial"
    np.zeros((ROWS, COLS), dtype=np.float32).tofile(partial)
    os.replace(partial, path)  # readers that mapped the old file keep reading the old file


def main():
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "rows.f32")
    try:
        np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS).tofile(path)
        seen = 0
        for k, (x, i) in enumerate(DataLoader(Rows(path), batch_size=64, num_workers=2)):
            if k == 1:  # both workers have mapped the file (batch 1 comes from the second worker)
                sync_new_version(path)
            seen += len(i)
            # a worker that mapped the file before the rename reads the old rows; one mapping after reads zeros
            assert all(float(row[0]) in (float(j) * COLS, 0.0) for row, j in zip(x, i.tolist()))
        assert seen == ROWS, seen
        print("rows", seen)
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
