"""Decode 'images' on demand into a small bounded cache in each persistent worker, its memory reused."""

import os
from collections import OrderedDict

import torch
from torch.utils.data import DataLoader, Dataset

# The lab's knobs (notebooks/09_interactive_lab.ipynb) arrive as LAB_* environment variables; the
# defaults are this lesson's own values, so `python this_script.py` runs the lesson unchanged.
NUM_WORKERS = int(os.environ.get("LAB_NUM_WORKERS", "2"))
BATCH_SIZE = int(os.environ.get("LAB_BATCH_SIZE", "4"))
PERSISTENT = os.environ.get("LAB_PERSISTENT_WORKERS", "1") == "1"


class CachedImages(Dataset):
    def __init__(self, n=100, cache_size=8):
        self.n, self.cache_size = n, cache_size
        # at most cache_size images (32 MiB) per worker; a new image is decoded into the oldest one's
        # memory (measured: a fresh 4 MiB per image, the oldest freed, grew each worker's heap by fragments
        # to 460 MiB for the run under fork with a cache of one; decoding in place: 229 MiB)
        self.cache = OrderedDict()

    def __len__(self):
        return self.n

    def _decode(self, i, out):
        g = torch.Generator().manual_seed(i)
        return torch.rand(1024, 1024, generator=g, out=out)

    def __getitem__(self, i):
        if i in self.cache:
            self.cache.move_to_end(i)
        elif len(self.cache) < self.cache_size:
            self.cache[i] = self._decode(i, torch.empty(1024, 1024))
        else:  # decode into the oldest image's memory: the cache never allocates past its size
            _, buf = self.cache.popitem(last=False)
            self.cache[i] = self._decode(i, buf)
        return self.cache[i].mean()


if __name__ == "__main__":
    torch.manual_seed(0)
    loader = DataLoader(CachedImages(), batch_size=BATCH_SIZE, shuffle=True, num_workers=NUM_WORKERS,
                        persistent_workers=PERSISTENT and NUM_WORKERS > 0)
    for epoch in range(4):
        means = [batch.mean().item() for batch in loader]
        print(f"epoch {epoch}: {len(means)} batches")
