# Modelled on https://github.com/pytorch/pytorch/issues/13246 (memory of forked workers grows: Python objects read)
"""A pandas DataFrame of paths held by the dataset: workers' memory grows as they read it, but the epoch ends."""

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset


class Manifest(Dataset):
    def __init__(self, n=200_000):
        paths = [f"images/{i % 100:03d}/{i:08d}.jpg" for i in range(n)]
        self.df = pd.DataFrame({"path": pd.Series(paths, dtype=object), "label": np.arange(n) % 100})

    def __len__(self):
        return len(self.df)

    def __getitem__(self, i):
        row = self.df.iloc[i]
        return torch.tensor(int(row["path"][7:10]) == row["label"])


if __name__ == "__main__":
    right = 0
    for k, batch in enumerate(DataLoader(Manifest(), batch_size=1000, shuffle=True, num_workers=2)):
        right += int(batch.sum())
        if k == 19:
            break
    assert right == 20_000, right
    print("labels match", right)
