"""Train on rows of a memory-mapped data file while a sync job rewrites that file in place."""

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
    """Copy a new version over the old one as `cp` does: truncate the file, then write it again."""
    with open(path, "r+b") as fh:
        fh.truncate(0)
        fh.write(np.zeros((ROWS // 8, COLS), dtype=np.float32).tobytes())  # the copy has only begun


def main():
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "rows.f32")
    try:
        np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS).tofile(path)
        for k, (x, i) in enumerate(DataLoader(Rows(path), batch_size=64, num_workers=2)):
            if k == 1:  # both workers have mapped the file (batch 1 comes from the second worker)
                sync_new_version(path)
        print("last row", int(i[-1]))
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
