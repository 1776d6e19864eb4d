"""Decode 'images' once and keep them in a cache in each persistent worker, so later epochs are fast."""

import os

import torch
from torch.utils.data import DataLoader, Dataset

# The lab's knobs (notebooks/09_interactive_lab.ipynb) arrive as LAB_* environment variables; the
# defaults are this lesson's own values, so `python this_script.py` runs the lesson unchanged.
NUM_WORKERS = int(os.environ.get("LAB_NUM_WORKERS", "2"))
BATCH_SIZE = int(os.environ.get("LAB_BATCH_SIZE", "4"))
PERSISTENT = os.environ.get("LAB_PERSISTENT_WORKERS", "1") == "1"


class CachedImages(Dataset):
    def __init__(self, n=100):
        self.n = n
        self.cache = {}  # each worker has its own copy of this dict, and fills it

    def __len__(self):
        return self.n

    def _decode(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.rand(1024, 1024, generator=g)  # 4 MiB per decoded image: 400 MiB for all 100

    def __getitem__(self, i):
        if i not in self.cache:
            self.cache[i] = self._decode(i)
        return self.cache[i].mean()


if __name__ == "__main__":
    torch.manual_seed(0)  # the same shuffles every run
    # persistent workers keep their caches from one epoch to the next; with shuffle=True each worker
    # meets most of the images within a few epochs
    loader = DataLoader(CachedImages(), batch_size=BATCH_SIZE, shuffle=True, num_workers=NUM_WORKERS,
                        persistent_workers=PERSISTENT and NUM_WORKERS > 0)
    for epoch in range(4):
        means = [batch.mean().item() for batch in loader]
        print(f"epoch {epoch}: {len(means)} batches")
