# Modelled on https://github.com/pytorch/pytorch/issues/45198 (OpenCV used in the main process, then forked workers)
"""Augmentation with OpenCV in the workers after the main process resized images with OpenCV's thread pool."""

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Augmented(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        img = np.full((256, 256, 3), i, dtype=np.uint8)
        return torch.from_numpy(cv2.resize(cv2.GaussianBlur(img, (5, 5), 0), (64, 64)))


if __name__ == "__main__":
    cv2.resize(np.zeros((2048, 2048, 3), dtype=np.uint8), (1024, 1024))  # OpenCV's pool runs here first
    seen = sum(len(b) for b in DataLoader(Augmented(), batch_size=4, num_workers=2, multiprocessing_context="fork"))
    assert seen == 16, seen
    print("images", seen)
