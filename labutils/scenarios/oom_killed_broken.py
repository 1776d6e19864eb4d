"""Decode 'images' once and keep them in a per-worker cache to make later epochs faster."""

import torch
from torch.utils.data import DataLoader, Dataset


class CachedImages(Dataset):
    def __init__(self, n=160):
        self.n = n
        self.cache = {}

    def __len__(self):
        return self.n

    def _decode(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.rand(1024, 1024, generator=g)  # 4 MiB per decoded image

    def __getitem__(self, i):
        if i not in self.cache:
            self.cache[i] = self._decode(i)
        return self.cache[i].mean()


if __name__ == "__main__":
    loader = DataLoader(CachedImages(), batch_size=4, num_workers=2)
    for epoch in range(2):
        means = [batch.mean().item() for batch in loader]
        print(f"epoch {epoch}: {len(means)} batches")
