# Modelled on https://github.com/pola-rs/polars/issues/17526 (DataFrame.filter freezes in DataLoader workers)
"""Rows selected with polars in __getitem__; the main process has used polars before the workers fork."""

import numpy as np
import polars as pl
import torch
from torch.utils.data import DataLoader, Dataset


class Sessions(Dataset):
    def __init__(self):
        self.df = pl.DataFrame({"user": np.arange(100_000) % 50, "clicks": np.ones(100_000)})
        self.users = self.df.group_by("user").agg(pl.col("clicks").sum())  # polars' pool runs here

    def __len__(self):
        return 50

    def __getitem__(self, user):
        return torch.tensor(self.df.filter(pl.col("user") == user)["clicks"].sum())


if __name__ == "__main__":
    # timeout: a worker that never answers ends the loop after 5 s instead of never
    for batch in DataLoader(Sessions(), batch_size=10, num_workers=2, multiprocessing_context="fork", timeout=5):
        print(batch)
