"""Run a model over a dataset and keep every batch of outputs for an evaluation at the end."""

import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, i):
        return {"features": torch.randn(8), "label": torch.tensor(i % 2)}


if __name__ == "__main__":
    kept = []
    for batch in DataLoader(Samples(), batch_size=4, num_workers=2):
        kept.append(batch)
    labels = torch.cat([b["label"] for b in kept])
    print("evaluated", len(labels), "samples")
