"""Classify images from an ImageFolder-style tree (root/class_k/file) decoded with Pillow."""

import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset


def make_tree(root, n=48):
    """n small PNG images in two classes; every 12th file is a download cut short."""
    for i in range(n):
        folder = Path(root, f"class_{i % 2}")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"img_{i:03d}.png"
        Image.fromarray(np.full((8, 8, 3), i, dtype=np.uint8)).save(path)
        if i % 12 == 5:
            path.write_bytes(path.read_bytes()[:20])


class ImageFolderDataset(Dataset):
    def __init__(self, root):
        self.files = sorted(Path(root).glob("class_*/*"))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        img = Image.open(self.files[i]).convert("RGB")
        return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255), int(self.files[i].parent.name[6:])


def main():
    root = tempfile.mkdtemp()
    try:
        make_tree(root)
        for x, y in DataLoader(ImageFolderDataset(root), batch_size=8, num_workers=2):
            pass
        print("done")
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
