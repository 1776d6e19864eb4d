"""The same quick experiment, with the training under a __main__ guard."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    x = torch.randn(128, 8)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=32, num_workers=2):
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("loss", round(loss.item(), 3))


if __name__ == "__main__":
    main()
