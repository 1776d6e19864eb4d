"""Loader throughput and epoch-start cost, measured the same way everywhere (notebooks 10 and 10b):
:func:`time_epochs`, :class:`SetThreads`, :func:`preload_forkserver`. Results are JSON-able; torch is imported
only when used.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from ..runner.startmethod import current

__all__ = ["SetThreads", "batch_len", "median", "preload_forkserver", "time_epochs"]


def batch_len(batch: Any) -> int:
    """Number of samples in a batch: a tensor's first dimension, or that of the first tensor inside a
    tuple, list, dict or :class:`~labutils.kit.fixes.QuarantinedBatch` (0 for an empty quarantined batch)."""
    data = getattr(batch, "data", batch) if type(batch).__name__ == "QuarantinedBatch" else batch
    if data is None:
        return 0
    if isinstance(data, Mapping):
        data = next(iter(data.values()))
    while isinstance(data, (list, tuple)) and data and not hasattr(data, "shape"):
        data = data[0]
    shape = getattr(data, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    return 1


def time_epochs(
    loader: Any, epochs: int = 1, step: Optional[Callable[[Any], Any]] = None, count: Callable[[Any], int] = batch_len
) -> list:
    """Iterate ``loader`` for ``epochs`` epochs; return one dict per epoch.

    Each dict holds ``first_batch_s`` (from ``iter()`` to the first batch: worker start-up, or the
    wake-up of persistent workers, plus one batch), ``samples`` and ``batches`` (delivered in the epoch),
    ``seconds`` (the whole epoch, ``iter()`` included) and ``samples_per_s`` (after the first batch, so
    start-up does not count; None with a single batch). ``step(batch)`` is called for every batch, as a
    training step would be.
    """
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a whole number of at least 1, not {epochs!r}")
    rows = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        first_at = None
        samples = batches = rest = 0
        for batch in loader:
            now = time.perf_counter()
            n = count(batch)
            if first_at is None:
                first_at = now
            else:
                rest += n
            samples += n
            batches += 1
            if step is not None:
                step(batch)
        end = time.perf_counter()
        after = end - first_at if first_at is not None else 0.0
        rows.append(
            {
                "first_batch_s": (first_at - t0) if first_at is not None else None,
                "samples": samples,
                "batches": batches,
                "seconds": end - t0,
                "samples_per_s": rest / after if rest and after > 0 else None,
            }
        )
    return rows


class SetThreads:
    """``worker_init_fn``: ``torch.set_num_threads(n)`` in each worker (``n=None``: all CPUs).

    PyTorch itself calls ``torch.set_num_threads(1)`` in every worker before ``worker_init_fn``;
    :attr:`seen` (in the worker) keeps what the worker had on entry, so a run can show it. A module-level
    class, so it pickles for spawn and forkserver.
    """

    seen: Optional[int] = None

    def __init__(self, n: Optional[int] = None) -> None:
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"n must be a whole number of threads (at least 1) or None, not {n!r}")
        self.n = n

    def threads(self) -> int:
        """The number of threads this init sets (``os.cpu_count()`` for None)."""
        return self.n if self.n is not None else (os.cpu_count() or 1)

    def __call__(self, worker_id: int) -> None:
        import torch

        SetThreads.seen = torch.get_num_threads()
        torch.set_num_threads(self.threads())

    def __repr__(self) -> str:
        return f"SetThreads({self.n!r})"


def preload_forkserver(modules: Sequence[str] = ("torch",), start: bool = True) -> Optional[float]:
    """Have the fork server import ``modules`` once (after its default, ``__main__``), so that forkserver
    workers fork from a process that has them instead of importing torch each (seconds, every epoch).

    Call it before anything starts the fork server (a running server keeps what it has). With ``start`` and
    forkserver as the method a loader would use now, the server is started at once and this waits until it
    can fork, so that no loader's first batch (nor its ``timeout``) waits for its torch import; returns the
    seconds that took, else None. Fork and spawn have no fork server: nothing changes there.
    """
    names = [modules] if isinstance(modules, str) else list(modules)
    if not names or not all(isinstance(m, str) and m for m in names):
        raise ValueError(f"modules must be module names such as 'torch', not {modules!r}")
    # keep the default "__main__" (the script itself, which Python 3.14's server really preloads) in front
    multiprocessing.set_forkserver_preload(["__main__", *[m for m in names if m != "__main__"]])
    if not start or current() != "forkserver":
        return None
    t0 = time.perf_counter()
    probe = multiprocessing.get_context("forkserver").Process(target=os.getpid, daemon=True)
    probe.start()
    probe.join()
    return time.perf_counter() - t0


def median(values: Sequence[float]) -> float:
    """The median of the measurements that are not None."""
    kept = [v for v in values if v is not None]
    if not kept:
        raise ValueError("no measurement to take the median of")
    return float(statistics.median(kept))
