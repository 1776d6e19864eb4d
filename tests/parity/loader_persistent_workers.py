# parity: torch race timeout=60
# persistent_workers=True over two epochs, the loader left in a global at exit.
import torch
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    loader = DataLoader(TensorDataset(torch.arange(16.0)), batch_size=4, num_workers=2, persistent_workers=True)
    for epoch in range(2):
        print("epoch", epoch, sum(float(b[0].sum()) for b in loader))
