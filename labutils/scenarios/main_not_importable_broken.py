"""Train on synthetic squares; the dataset class is defined right here, as in a notebook cell."""

import torch
from torch.utils.data import DataLoader, Dataset


class Shapes(Dataset):
    def __init__(self, n=64, size=16):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        level = i / self.n
        return torch.full((1, self.size, self.size), level), int(level > 0.5)


if __name__ == "__main__":
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(256, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(Shapes(), batch_size=16, shuffle=True, num_workers=2):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("loss", round(loss.item(), 3))
