"""Train a tiny classifier on rows of a CSV-like label file."""

import os

import torch
from torch.utils.data import DataLoader, Dataset

# The lab's knobs (notebooks/09_interactive_lab.ipynb) arrive as LAB_* environment variables; the
# defaults are this lesson's own values, so `python this_script.py` runs the lesson unchanged.
NUM_WORKERS = int(os.environ.get("LAB_NUM_WORKERS", "2"))
BATCH_SIZE = int(os.environ.get("LAB_BATCH_SIZE", "8"))

CLASSES = {"cat": 0, "dog": 1, "bird": 2}
ROWS = [f"img_{i:03d}.png,{name}" for i, name in zip(range(60), ["cat", "dog", "bird"] * 20)]
ROWS[37] = "img_037.png,dgo"  # a typo someone made while labelling


class LabelledImages(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        path, label = self.rows[i].split(",")
        pixels = torch.full((3, 8, 8), float(i) / len(self.rows))
        return pixels, CLASSES[label]


def main():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(LabelledImages(ROWS), batch_size=BATCH_SIZE, num_workers=NUM_WORKERS)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("trained on", len(loader.dataset), "images")


if __name__ == "__main__":
    main()
