"""Load a dataset with as many workers as the largest machine of the cluster has cores."""

import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor([i, i * i])


if __name__ == "__main__":
    # fork: the start method whose refusal reaches the loader as it is (see notebook 06)
    loader = DataLoader(Samples(), batch_size=4, num_workers=16, multiprocessing_context="fork")
    rows = [r for batch in loader for r in batch.tolist()]
    print("loaded", len(rows), "samples")
