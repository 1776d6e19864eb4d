# Modelled on https://github.com/Lightning-AI/litData/issues/823 (a spawn context resolves the polars hang)
"""The same polars dataset, its workers started with spawn."""

import multiprocessing as mp

import numpy as np
import polars as pl
import torch
from torch.utils.data import DataLoader, Dataset


class Sessions(Dataset):
    def __init__(self):
        self.df = pl.DataFrame({"user": np.arange(100_000) % 50, "clicks": np.ones(100_000)})
        self.users = self.df.group_by("user").agg(pl.col("clicks").sum())

    def __len__(self):
        return 50

    def __getitem__(self, user):
        return torch.tensor(self.df.filter(pl.col("user") == user)["clicks"].sum())


if __name__ == "__main__":
    total = sum(float(b.sum()) for b in DataLoader(Sessions(), batch_size=10, num_workers=2,
                                                   multiprocessing_context=mp.get_context("spawn")))
    assert total == 100_000, total
    print("clicks", total)
