"""Feed 512x512 RGB images as float tensors to a small model."""

import torch
from torch.utils.data import DataLoader, Dataset


class Photos(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 512, 512, generator=g)


if __name__ == "__main__":
    pool = torch.nn.AdaptiveAvgPool2d(1)
    for batch in DataLoader(Photos(), batch_size=4, num_workers=2):
        features = pool(batch).flatten(1)
    print("features", tuple(features.shape))
