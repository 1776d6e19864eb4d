"""Load a dataset with a number of workers that fits the job's limit on processes."""

import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor([i, i * i])


if __name__ == "__main__":
    # 2 workers and their threads fit in a limit of 12 tasks; 16 workers did not
    loader = DataLoader(Samples(), batch_size=4, num_workers=2, multiprocessing_context="fork")
    rows = [r for batch in loader for r in batch.tolist()]
    assert rows == [[i, i * i] for i in range(64)]
    print("loaded", len(rows), "samples")
