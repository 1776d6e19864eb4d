"""Per-class feature sums with polars; the workers are started fresh (spawn), not forked."""

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


# polars' advice: a spawned worker starts its own pool (forkserver's server never ran polars either)
if __name__ == "__main__":
    means = []
    for batch in DataLoader(ClassMeans(), batch_size=2, num_workers=2, multiprocessing_context="spawn"):
        means += batch.flatten().tolist()
    assert means == [(ROWS - 10) / 2 + c for c in range(10)], means
    print("means", means)
