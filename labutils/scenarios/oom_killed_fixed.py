"""Decode 'images' on demand, keeping only a small bounded cache per worker."""

from collections import OrderedDict

import torch
from torch.utils.data import DataLoader, Dataset


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
    loader = DataLoader(CachedImages(), batch_size=4, num_workers=2)
    for epoch in range(2):
        means = [batch.mean().item() for batch in loader]
        print(f"epoch {epoch}: {len(means)} batches")
