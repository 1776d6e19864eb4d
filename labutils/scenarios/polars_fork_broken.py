"""Per-class feature sums with polars; the table's statistics are computed before the workers start."""

import numpy as np
import polars as pl
import torch
from torch.utils.data import DataLoader, Dataset

ROWS = 200_000


def table():
    return pl.DataFrame({"label": np.arange(ROWS) % 10, "value": np.arange(ROWS, dtype=np.float64)})


class ClassMeans(Dataset):
    """Each sample is one class's mean, computed by polars (on its thread pool) in the worker."""

    def __init__(self):
        self.df = table()
        self.means = self.df.group_by("label").agg(pl.col("value").mean())  # polars' pool starts here

    def __len__(self):
        return 10

    def __getitem__(self, label):
        rows = self.df.filter(pl.col("label") == label)
        return torch.tensor([rows["value"].mean()])


# Threads do not survive fork: the loader pins it, as Linux's default up to Python 3.13 does.
if __name__ == "__main__":
    for batch in DataLoader(ClassMeans(), batch_size=2, num_workers=2, multiprocessing_context="fork"):
        print("batch", batch.flatten().tolist())
