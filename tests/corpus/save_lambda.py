"""Trains, then saves a checkpoint that carries the LR schedule as a lambda."""

import os
import tempfile

import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    x = torch.randn(128, 4)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16, num_workers=2)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(net(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    ckpt = {"model": net.state_dict(), "schedule": lambda epoch: 0.95 ** epoch}
    path = os.path.join(tempfile.gettempdir(), f"ckpt-{os.getpid()}.pt")
    try:
        torch.save(ckpt, path)
    finally:
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
