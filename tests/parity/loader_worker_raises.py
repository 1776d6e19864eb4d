# parity: torch timeout=60
# A worker raises: the main process re-raises it with the worker's traceback; exit code 1.
import torch
from torch.utils.data import DataLoader, Dataset


class Broken(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            raise KeyError(f"sample {i} is missing")
        return torch.tensor(i)


if __name__ == "__main__":
    for batch in DataLoader(Broken(), batch_size=2, num_workers=1):
        print("batch", batch.tolist())
