"""A small, healthy training loop: synthetic features, 2 workers, a linear model."""

import torch
from torch.utils.data import DataLoader, Dataset


class Features(Dataset):
    def __init__(self, n=256, dim=16):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Features(), batch_size=32, shuffle=True, num_workers=2)
    for epoch in range(2):
        total = 0.0
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        print(f"epoch {epoch}: loss {total / len(loader):.3f}")


if __name__ == "__main__":
    main()
