"""Count a process's open file descriptors, also when it has none left (notebook 06): listing ``/proc/self/fd``
needs a free fd itself, so at the open-files limit :func:`open_fds` falls back to ``os.fstat`` on every fd number.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from ..machine import probes

#: Highest fd number the fstat scan looks at when the soft limit is unlimited or huge.
SCAN_CAP = 65536


def soft_limit() -> Optional[int]:
    """This process's soft RLIMIT_NOFILE, or None where ``resource`` does not exist (Windows) or it is unlimited."""
    limits = probes.nofile_limits()
    return None if limits is None or limits[0] == probes.RLIM_INFINITY else limits[0]


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
    listed = probes.open_fds()
    return listed if listed is not None else _scan(min(soft_limit() or SCAN_CAP, SCAN_CAP))


def per_step(counts: Sequence[int]) -> float:
    """Average growth per step of a series of fd counts (``(last - first) / (n - 1)``); needs two counts."""
    if len(counts) < 2:
        raise ValueError(f"need at least two counts to measure growth, got {len(counts)}")
    return (counts[-1] - counts[0]) / (len(counts) - 1)
