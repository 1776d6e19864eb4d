"""Move each sample to the GPU inside the Dataset, to have it ready for the model."""

import torch
from torch.utils.data import DataLoader, Dataset


class Points(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g).cuda(), i % 2


if __name__ == "__main__":
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Linear(8, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(Points(), batch_size=16, num_workers=2):
        loss = torch.nn.functional.cross_entropy(model(x), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("loss", round(loss.item(), 3))
