"""Feed 512x512 RGB images: workers ship compact uint8 pixels, the main process converts to float."""

import torch
from torch.utils.data import DataLoader, Dataset


class Photos(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return (torch.rand(3, 512, 512, generator=g) * 255).to(torch.uint8)


if __name__ == "__main__":
    pool = torch.nn.AdaptiveAvgPool2d(1)
    for batch in DataLoader(Photos(), batch_size=2, num_workers=2, prefetch_factor=1):
        features = pool(batch.float() / 255).flatten(1)
    print("features", tuple(features.shape))
