"""Normalise samples with a parallel numba kernel; workers come from a fork server that never ran it."""

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
    normalise(np.ones(10_000))  # compile and warm up in the main process, as before
    rows = 0
    for batch in DataLoader(Signals(), batch_size=4, num_workers=2, multiprocessing_context="forkserver"):
        assert abs(float(batch.mean())) < 1e-6
        rows += len(batch)
    assert rows == 16, rows
    print("rows", rows)
