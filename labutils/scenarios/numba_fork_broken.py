"""Normalise samples with a parallel numba kernel; the kernel is compiled and run once before training."""

import numba
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

numba.config.THREADING_LAYER = "omp"  # GNU OpenMP, numba's first choice where no TBB is installed


@numba.njit(parallel=True, cache=False)
def normalise(x):
    out = np.empty_like(x)
    mean = x.mean()
    for i in numba.prange(x.shape[0]):
        out[i] = x[i] - mean
    return out


class Signals(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.from_numpy(normalise(np.arange(10_000, dtype=np.float64) * i))


if __name__ == "__main__":
    normalise(np.ones(10_000))  # compile and warm up: numba's OpenMP threads now run in this process
    for batch in DataLoader(Signals(), batch_size=4, num_workers=2, multiprocessing_context="fork"):
        print("batch", tuple(batch.shape))
