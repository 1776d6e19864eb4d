# Modelled on https://github.com/python-pillow/Pillow/issues/4807 (macOS '._' files inside an ImageFolder tree)
"""An ImageFolder-style tree copied from a Mac: each image has a '._' AppleDouble companion that is not an image."""

import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset


class Faces(Dataset):
    def __init__(self, root):
        self.files = sorted(p for p in Path(root).glob("*/*") if p.suffix == ".jpg")

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return torch.from_numpy(np.asarray(Image.open(self.files[i]).convert("RGB"), dtype=np.float32))


if __name__ == "__main__":
    root = Path(tempfile.mkdtemp())
    try:
        (root / "aqua_eyes").mkdir()
        for i in range(16):
            Image.fromarray(np.full((8, 8, 3), i, dtype=np.uint8)).save(root / "aqua_eyes" / f"img{i}.jpg")
            (root / "aqua_eyes" / f"._img{i}.jpg").write_bytes(b"\x00\x05\x16\x07" + bytes(60))
        for _batch in DataLoader(Faces(root), batch_size=4, shuffle=True, num_workers=2):
            pass
    finally:
        shutil.rmtree(root)
