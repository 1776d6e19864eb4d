"""Count a process's open file descriptors, also when it has none left (notebook 06).

Listing ``/proc/self/fd`` needs a free fd itself, so at the open-files limit it fails with ``EMFILE``.
:func:`open_fds` then falls back to ``os.fstat`` on every fd number below the soft limit, which needs no
new fd. :func:`per_step` reads a series of counts as fds per step (one fd per kept batch, two per kept
``(images, labels)`` batch...).
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

#: Highest fd number the fstat scan looks at when the soft limit is unlimited or huge.
SCAN_CAP = 65536


def soft_limit() -> Optional[int]:
    """This process's soft RLIMIT_NOFILE, or None where ``resource`` does not exist (Windows) or it is unlimited."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def _scan(limit: int) -> int:
    count = 0
    for fd in range(limit):
        try:
            os.fstat(fd)
        except OSError:
            continue
        count += 1
    return count


def open_fds(limit: Optional[int] = None) -> int:
    """Number of open fds of this process.

    With ``limit`` given, counts fds ``0 .. limit-1`` with ``os.fstat`` (no fd needed). Otherwise lists
    ``/proc/self/fd`` (or ``/dev/fd``), not counting the listing's own fd, and where that fails (no free
    fd, no such folder) scans up to the soft limit (at most :data:`SCAN_CAP`).
    """
    if limit is not None:
        return _scan(limit)
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        return len(names) - 1  # the directory listing had an fd of its own open
    soft = soft_limit()
    return _scan(min(soft or SCAN_CAP, SCAN_CAP))


def per_step(counts: Sequence[int]) -> float:
    """Average growth per step of a series of fd counts (``(last - first) / (n - 1)``); needs two counts."""
    if len(counts) < 2:
        raise ValueError(f"need at least two counts to measure growth, got {len(counts)}")
    return (counts[-1] - counts[0]) / (len(counts) - 1)
