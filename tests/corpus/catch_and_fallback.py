"""A 'safe' training loop: if the fast loader fails, retry with num_workers=0."""

import torch
from torch.utils.data import DataLoader, Dataset


class Augmented(Dataset):
    def __init__(self):
        self.data = torch.arange(32.0)
        self.transform = lambda v: v * 2  # fine in-process, unpicklable for spawn

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.transform(self.data[i])


def run_epoch(loader):
    return sum(batch.sum().item() for batch in loader)


def safe_train_loop(dataset):
    try:
        loader = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="spawn")
        return run_epoch(loader)
    except Exception as exc:
        print(f"loader failed ({type(exc).__name__}); falling back to num_workers=0")
        return run_epoch(DataLoader(dataset, batch_size=4, num_workers=0))


if __name__ == "__main__":
    print("total", safe_train_loop(Augmented()))
