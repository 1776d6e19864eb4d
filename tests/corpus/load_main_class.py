"""Evaluates a whole pickled model: the class it was saved with is not defined in this script."""

import io

import torch
from torch.utils.data import DataLoader, TensorDataset


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(x)


def saved_elsewhere() -> bytes:
    """A checkpoint written by the training script, where Net lived in its __main__."""
    buf = io.BytesIO()
    torch.save(Net(), buf)
    return buf.getvalue()


def main():
    blob = saved_elsewhere()
    del globals()["Net"]  # this evaluation script never defined it
    x = torch.randn(60, 6)
    batches = list(DataLoader(TensorDataset(x), batch_size=20, num_workers=2))
    model = torch.load(io.BytesIO(blob), weights_only=False)
    for (xb,) in batches:
        print(model(xb).argmax(1).tolist())


if __name__ == "__main__":
    main()
