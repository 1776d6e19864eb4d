# parity: torch timeout=60
# A DataLoader iterator with live workers kept in a global when the script returns, half consumed: python
# exits at once (its exit handler stops the workers), printing nothing more. A batch from each worker first:
# a spawn worker still starting at exit dies of that SIGTERM or misses its semaphore, a race python shows
# too (2 runs in 39 here, on a loaded machine).
import torch
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":  # spawn workers import the script: without the guard they would start loaders too
    data = TensorDataset(torch.arange(64, dtype=torch.float32))
    it = iter(DataLoader(data, batch_size=4, num_workers=2))
    print("first batch", next(it)[0].tolist())
    print("second batch", next(it)[0].tolist())
