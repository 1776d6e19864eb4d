"""Run a model over a dataset and keep only what the evaluation needs, as plain numbers."""

import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, i):
        return {"features": torch.randn(8), "label": torch.tensor(i % 2)}


if __name__ == "__main__":
    labels = []
    for batch in DataLoader(Samples(), batch_size=4, num_workers=2):
        labels.extend(batch["label"].tolist())
    print("evaluated", len(labels), "samples")
