"""Decode 'images' on demand, keeping only a small bounded cache per worker."""

import os
from collections import OrderedDict

import torch
from torch.utils.data import DataLoader, Dataset

# The lab's knobs (notebooks/09_interactive_lab.ipynb) arrive as LAB_* environment variables; the
# defaults are this lesson's own values, so `python this_script.py` runs the lesson unchanged.
NUM_WORKERS = int(os.environ.get("LAB_NUM_WORKERS", "2"))
BATCH_SIZE = int(os.environ.get("LAB_BATCH_SIZE", "4"))


class CachedImages(Dataset):
    def __init__(self, n=160, cache_size=8):
        self.n, self.cache_size = n, cache_size
        self.cache = OrderedDict()

    def __len__(self):
        return self.n

    def _decode(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.rand(1024, 1024, generator=g)

    def __getitem__(self, i):
        if i in self.cache:
            self.cache.move_to_end(i)
        else:
            self.cache[i] = self._decode(i)
            if len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        return self.cache[i].mean()


if __name__ == "__main__":
    loader = DataLoader(CachedImages(), batch_size=BATCH_SIZE, num_workers=NUM_WORKERS)
    for epoch in range(2):
        means = [batch.mean().item() for batch in loader]
        print(f"epoch {epoch}: {len(means)} batches")
