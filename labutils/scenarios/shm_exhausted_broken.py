"""Feed 512x512 RGB images as float tensors to a small model."""

import os

import torch
from torch.utils.data import DataLoader, Dataset

# The lab's knobs (notebooks/09_interactive_lab.ipynb) arrive as LAB_* environment variables; the
# defaults are this lesson's own values, so `python this_script.py` runs the lesson unchanged.
NUM_WORKERS = int(os.environ.get("LAB_NUM_WORKERS", "2"))
BATCH_SIZE = int(os.environ.get("LAB_BATCH_SIZE", "4"))
PREFETCH_FACTOR = int(os.environ.get("LAB_PREFETCH_FACTOR", "2"))


class Photos(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 512, 512, generator=g)


if __name__ == "__main__":
    pool = torch.nn.AdaptiveAvgPool2d(1)
    for batch in DataLoader(
        Photos(),
        batch_size=BATCH_SIZE,
        num_workers=NUM_WORKERS,
        prefetch_factor=PREFETCH_FACTOR if NUM_WORKERS else None,
    ):
        features = pool(batch).flatten(1)
    print("features", tuple(features.shape))
