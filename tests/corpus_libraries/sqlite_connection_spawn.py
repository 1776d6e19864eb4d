# Modelled on https://github.com/pytorch/examples/issues/526 (a handle spawn cannot pickle), with SQLite
"""An annotations database opened with sqlite3 in __init__, loaded by forkserver workers (Python 3.14's default)."""

import os
import shutil
import sqlite3
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset


class Annotations(Dataset):
    def __init__(self, path):
        self.db = sqlite3.connect(path)
        self.n = self.db.execute("select count(*) from boxes").fetchone()[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(self.db.execute("select x, y from boxes where id = ?", (i,)).fetchone())


if __name__ == "__main__":
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "boxes.sqlite")
    try:
        with sqlite3.connect(path) as db:
            db.execute("create table boxes (id integer primary key, x real, y real)")
            db.executemany("insert into boxes values (?, ?, ?)", [(i, i, -i) for i in range(32)])
        for _batch in DataLoader(Annotations(path), batch_size=8, num_workers=2, multiprocessing_context="forkserver"):
            pass
    finally:
        shutil.rmtree(folder)
