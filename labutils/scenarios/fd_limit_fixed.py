"""Run a model over a dataset and keep only what the evaluation needs, as plain numbers."""

import os

import torch
from torch.utils.data import DataLoader, Dataset

# The lab's knobs (notebooks/09_interactive_lab.ipynb) arrive as LAB_* environment variables; the
# defaults are this lesson's own values, so `python this_script.py` runs the lesson unchanged.
NUM_WORKERS = int(os.environ.get("LAB_NUM_WORKERS", "2"))
BATCH_SIZE = int(os.environ.get("LAB_BATCH_SIZE", "4"))
SHARING_STRATEGY = os.environ.get("LAB_SHARING_STRATEGY", "file_descriptor")
# at import, so that spawn and forkserver workers (which import this script) use it too
torch.multiprocessing.set_sharing_strategy(SHARING_STRATEGY)


class Samples(Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, i):
        return {"features": torch.randn(8), "label": torch.tensor(i % 2)}


if __name__ == "__main__":
    labels = []
    for batch in DataLoader(Samples(), batch_size=BATCH_SIZE, num_workers=NUM_WORKERS):
        labels.extend(batch["label"].tolist())
    print("evaluated", len(labels), "samples")
