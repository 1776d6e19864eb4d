# parity: torch timeout=60
# A training script that saves a checkpoint from an exit handler, using its module globals (torch, the model).
import atexit

import torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(2, 1)


def save():
    torch.save({"w": model.weight.detach().clone()}, "ckpt.pt")
    print("checkpoint saved:", sorted(torch.load("ckpt.pt")), flush=True)


if __name__ == "__main__":
    # registered under the guard: at the top level, spawn workers (which import the script) register it too,
    # and their exits write the same file at once (a corrupt read under python as under the lab, a race)
    atexit.register(save)
    data = TensorDataset(torch.ones(8, 2))
    for (x,) in DataLoader(data, batch_size=4, num_workers=2):
        model(x).sum().backward()
    print("trained")
