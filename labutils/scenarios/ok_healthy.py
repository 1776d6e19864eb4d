"""A small, healthy training loop: synthetic features, 2 workers, a linear model."""

import os

import torch
from torch.utils.data import DataLoader, Dataset

# The lab's knobs (notebooks/09_interactive_lab.ipynb) arrive as LAB_* environment variables; the
# defaults are this lesson's own values, so `python this_script.py` runs the lesson unchanged.
NUM_WORKERS = int(os.environ.get("LAB_NUM_WORKERS", "2"))
BATCH_SIZE = int(os.environ.get("LAB_BATCH_SIZE", "32"))
PREFETCH_FACTOR = int(os.environ.get("LAB_PREFETCH_FACTOR", "2"))
PIN_MEMORY = os.environ.get("LAB_PIN_MEMORY", "0") == "1"
PERSISTENT_WORKERS = os.environ.get("LAB_PERSISTENT_WORKERS", "0") == "1"
SHARING_STRATEGY = os.environ.get("LAB_SHARING_STRATEGY", "file_descriptor")
# at import, so that spawn and forkserver workers (which import this script) use it too
torch.multiprocessing.set_sharing_strategy(SHARING_STRATEGY)


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
    loader = DataLoader(
        Features(),
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=NUM_WORKERS,
        prefetch_factor=PREFETCH_FACTOR if NUM_WORKERS else None,
        pin_memory=PIN_MEMORY,
        persistent_workers=PERSISTENT_WORKERS and NUM_WORKERS > 0,
    )
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
