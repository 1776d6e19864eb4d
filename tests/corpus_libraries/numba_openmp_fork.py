# Modelled on https://github.com/coqui-ai/STT/issues/2268 (numba/OpenMP: "Terminating: fork() called")
"""Feature extraction with a parallel numba kernel, warmed up in the main process before the workers fork."""

import numba
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

numba.config.THREADING_LAYER = "omp"


@numba.njit(parallel=True)
def energy(frames):
    out = np.empty(frames.shape[0])
    for i in numba.prange(frames.shape[0]):
        out[i] = (frames[i] ** 2).sum()
    return out


class Clips(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.from_numpy(energy(np.full((100, 160), float(i))))


if __name__ == "__main__":
    energy(np.zeros((4, 160)))  # compile once, up front
    for batch in DataLoader(Clips(), batch_size=2, num_workers=2, multiprocessing_context="fork"):
        print(batch.shape)
