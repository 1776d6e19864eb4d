"""Training on tabular features: the loader is fine, but the model was built for the wrong input size."""

import torch
from torch.utils.data import DataLoader, Dataset


class Readings(Dataset):
    """Sensor readings: 20 features per row, a binary label."""

    def __init__(self, n=512, features=20):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, features, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    loader = DataLoader(Readings(), batch_size=64, shuffle=True, num_workers=2)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        for step, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch}: last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
