"""Measurements the notebooks make on a finished run or on this machine (small, tested helpers).

Results are data: these functions read a :class:`~labutils.runner.result.RunResult`, they do not change it.
"""

from __future__ import annotations

import signal
from typing import Optional

from ..diagnosis.messages import is_echo_traceback
from ..runner.channel import emit
from .leftovers import left_behind, unended


def run_start_method(result) -> Optional[str]:
    """The start method the run's first DataLoader with workers used, from its iterator record; None if no
    loader with workers started."""
    for event in getattr(result, "loader_events", []) or []:
        if event.get("event") == "iter" and event.get("num_workers") and event.get("start_method"):
            return event["start_method"]
    return None


# Used as a DataLoader's worker_init_fn and collate_fn (notebook 04): each worker measures itself when it
# starts and after reading the samples of each batch, and the numbers travel to the main process with
# the batch. Module-level functions, so spawn and forkserver workers can import them.
_birth: dict = {}


def note_birth(worker_id: int) -> None:
    """``worker_init_fn``: record this worker's RSS, USS and PSS before it has read any sample."""
    import psutil

    _birth.clear()
    _birth.update(psutil.Process().memory_full_info()._asdict())


def collate_with_memory(samples):
    """``default_collate(samples)`` plus this worker's memory (bytes) now and at birth, as a dict."""
    import psutil
    from torch.utils.data import default_collate, get_worker_info

    full = psutil.Process().memory_full_info()
    info = get_worker_info()
    mem = {"worker": info.id if info is not None else None, "rss": full.rss, "uss": full.uss,
           "pss": getattr(full, "pss", None), "birth_rss": _birth.get("rss"), "birth_uss": _birth.get("uss"),
           "birth_pss": _birth.get("pss")}
    return default_collate(samples), mem


def run_batches(loader, batches: int, key: str = "mem") -> dict:
    """Take ``batches`` batches of a loader built with :func:`collate_with_memory`; emit and return the reports.

    The record (``{"reports": [...], "first": ..., "items": n}``) goes to the run's values under ``key`` via
    :func:`labutils.emit`; ``first`` holds the first items of the first batch, to check the data.
    """
    reports, first, items = [], None, 0
    for k, (data, mem) in enumerate(loader):
        reports.append(dict(mem, batch=k))
        items += len(data[0]) if isinstance(data, (list, tuple)) else len(data)
        if first is None:
            first = [x[:4].tolist() for x in data] if isinstance(data, (list, tuple)) else data[:2, :4].tolist()
        if k + 1 == batches:
            break
    record = {"reports": reports, "first": first, "items": items}
    emit(**{key: record})
    return record


def shm_left(run, prefixes: tuple = ("torch_", "sem.mp-")) -> list:
    """The run's own ``/dev/shm`` files that PyTorch and multiprocessing left for the runner to unlink
    (:func:`labutils.kit.leftovers.left_behind`'s ``files`` starting with ``prefixes``); ``[]`` after a clean run."""
    return [n for n in left_behind(run)["files"] if n.startswith(prefixes)]


def unended_workers(run) -> list:
    """Status lines of the run's processes that outlived its own shutdown (no exit status recorded), unless
    PyTorch left them running itself (:func:`labutils.kit.leftovers.unended`)."""
    return [f"{w.role} {w.pid}: {w.status}" for w in unended(run, getattr(run, "workers", []) or [])]


def crashed_workers(run) -> list:
    """Status lines of the run's DataLoader workers that ended otherwise than a worker that only raised.

    Such a worker sends its exception and lives on; it ends with 0 when told to stop, by the SIGTERM that
    multiprocessing's exit handler sends the daemonic workers still alive when the main process exits (a
    worker whose parent is the fork server, or one still starting, dies of it), or, where PyTorch's SIGCHLD
    handler raised inside that handler, still running after the main process (see :func:`unended_workers`).
    """
    workers = list(getattr(run, "dataloader_workers", None) or [])
    left_by_pytorch = {w.pid for w in workers if w.exitcode is None} - {w.pid for w in unended(run, workers)}
    return [f"{w.role} {w.pid}: {w.status}" for w in workers
            if w.exitcode not in (0, -signal.SIGTERM) and w.pid not in left_by_pytorch]


def echoes(run) -> list:
    """The exceptions of ``run``'s chain raised while fetching a batch from a worker that had died: echoes
    of its death, never its reason (notebook 01; :func:`labutils.diagnosis.messages.is_echo_traceback`)."""
    return [e for e in getattr(run, "exceptions", []) or [] if is_echo_traceback(e.type, e.traceback)]


def kernel_max_usage(run) -> Optional[int]:
    """The kernel's own peak memory charge of the run's cgroup (bytes), or None where the kernel did not
    enforce the run's memory budget (the watchdog did, or there was none). Not a sampled figure."""
    limit = getattr(run, "memory_limit", None) or {}
    if limit.get("enforced_by") != "kernel":
        return None
    return (limit.get("kernel_record") or {}).get("max_usage")
