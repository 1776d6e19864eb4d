"""Notebook 10b's benchmark script (copied next to the notebook's scripts and run as ``bench.py``).

Throughput (samples/s after the first batch) against ``num_workers``, with one or all-CPU intra-op threads
per worker, and the recommended loader (``lab_loader.make_loader``, written by the notebook) against a bare
loader with the same work per sample, in turns. Arguments: a data_gen folder, the worker counts ("1,2,4").
"""

import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from labutils.kit.throughput import SetThreads, preload_forkserver, time_epochs
from labutils.runner.channel import emit

KERNEL = torch.randn(8, 3, 3, 3)


def augment(x):
    # some CPU work per sample that torch can spread over threads: a small convolution, then pooling
    return F.avg_pool2d(F.conv2d(x[None], KERNEL, padding=1), 4)[0]


class BareArrays(Dataset):
    # the same loading and work as the recommended loader, without its checks and quarantine
    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return augment(torch.from_numpy(np.load(self.files[i]))), i


def steady(loader, epochs):
    """Samples/s over ``epochs`` epochs, each timed after its first batch, and the batches timed."""
    rows = [r for r in time_epochs(loader, epochs) if r["samples_per_s"]]
    after = [r["seconds"] - r["first_batch_s"] for r in rows]  # each epoch after its first batch
    timed = sum(r["samples_per_s"] * a for r, a in zip(rows, after))
    return {"samples_per_s": timed / sum(after), "batches": sum(r["batches"] - 1 for r in rows),
            "samples": sum(r["samples"] for r in rows)}


def cpu_seconds():
    """CPU time (user + system) of this process and every descendant alive now: the work done, which a
    neighbour's load changes far less than the wall time."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for p in me.children(recursive=True):
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


if __name__ == "__main__":
    from lab_loader import make_loader

    from data_gen import Manifest

    preload_forkserver()  # worker start-up is not measured here; under forkserver it takes milliseconds
    data = Manifest.load(sys.argv[1])
    files = [str(data.path_of(e)) for e in data.good()]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()  # may run on
    sweep, bare = [], None
    # workers first: a forked worker that raises its thread count after the main process has run
    # parallel torch code can deadlock in OpenMP (pytorch issue 45198), so the main process stays idle
    for n in [int(x) for x in sys.argv[2].split(",")]:
        for threads in (1, cpus):
            loader = DataLoader(BareArrays(files), batch_size=16, num_workers=n, persistent_workers=True,
                                worker_init_fn=SetThreads(threads), timeout=60)
            next(iter(loader))  # start the workers
            sweep.append({"num_workers": n, "threads": threads, **steady(loader, 3)})
            if (n, threads) == (2, 1):
                bare = loader  # the bare loader of the turns below (1 thread is PyTorch's own setting)
            del loader
    # robust vs bare, same settings (2 workers, 1 thread each), in turns
    if bare is None:
        bare = DataLoader(BareArrays(files), batch_size=16, num_workers=2, persistent_workers=True, timeout=60)
    robust = make_loader(files, data.params["shape"], batch_size=16, num_workers=2, transform=augment)
    steady(bare, 1), steady(robust, 1)  # start the workers
    turns = {"bare": [], "robust": [], "bare_cpu_us": [], "robust_cpu_us": []}
    for _ in range(5):  # in turns: a slow patch of a shared machine hits both loaders
        for name, loader in (("bare", bare), ("robust", robust)):
            cpu0 = cpu_seconds()
            row = steady(loader, 1)  # one epoch a turn (the good samples of the folder: 94 in the notebook)
            turns[name].append(row["samples_per_s"])
            turns[f"{name}_cpu_us"].append((cpu_seconds() - cpu0) / row["samples"] * 1e6)
    del bare, robust
    emit(sweep=sweep, turns=turns, cpus=cpus, samples=len(files), load=os.getloadavg())
