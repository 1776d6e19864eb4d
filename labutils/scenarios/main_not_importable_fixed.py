"""Train on synthetic squares; the dataset class is imported from a module, so workers can import it."""

import torch
from torch.utils.data import DataLoader

from labutils.scenarios.shapes import Shapes

if __name__ == "__main__":
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(256, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(Shapes(), batch_size=16, shuffle=True, num_workers=2):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("loss", round(loss.item(), 3))
