"""Measurements the notebooks make on a finished run or on this machine (small, tested helpers).

Results are data: these functions read a :class:`~labutils.runner.result.RunResult`, they do not change it.
"""

from __future__ import annotations

from typing import Optional


def run_start_method(result) -> Optional[str]:
    """The start method the run's first DataLoader with workers used (``fork``/``forkserver``/``spawn``).

    Read from the iterator record the run wrote when the loader started; None if no loader with workers
    was started (for example ``num_workers=0``, or the script failed earlier).
    """
    for event in getattr(result, "loader_events", []) or []:
        if event.get("event") == "iter" and event.get("num_workers") and event.get("start_method"):
            return event["start_method"]
    return None


# --------------------------------------------------------------------------- worker memory, batch by batch
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
    from ..runner.channel import emit

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
