"""Trains on the CPU after the CUDA wheel failed to initialise (as on a node with a broken driver)."""

import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

# What a CUDA build of torch prints on such a node (torch/cuda/__init__.py warns and falls back).
sys.stderr.write(
    f"{torch.__file__.rsplit('/', 1)[0]}/cuda/__init__.py:129: UserWarning: CUDA initialization: Unexpected "
    "error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() that "
    "might have already set an error? Error 804: forward compatibility was attempted on non supported HW "
    "(Triggered internally at ../c10/cuda/CUDAFunctions.cpp:108.)\n"
    "  return torch._C._cuda_getDeviceCount() > 0\n")


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print("training on", device)
    x = torch.randn(256, 8)
    y = (x[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, num_workers=2, shuffle=True)
    net = torch.nn.Linear(8, 2).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for xb, yb in loader:
        loss = torch.nn.functional.cross_entropy(net(xb.to(device)), yb.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("done, loss", round(loss.item(), 3))


if __name__ == "__main__":
    main()
