"""Notebook 12's /dev/shm meter: the shared memory that this process's lab runs hold, found by identity.

:class:`~labutils.kit.shmwatch.PeakMeter` reads the whole ``/dev/shm`` filesystem, which every program shares.
:class:`RunShmMeter` counts only the files that the processes of *this* runner's runs map or hold open, from
``/proc`` alone: a process is a run's when its environment carries this runner's mark (``LABUTILS_RUNNER``
or the warm template's ``LABUTILS_TEMPLATE``), which the torchrun agent, its ranks and their workers all
inherit; a file counts once by its inode (PyTorch unlinks its segments at once: maps and fds are where they
are). Linux only: elsewhere ``supported`` is False and ``peak`` None.
"""

from __future__ import annotations

import os
import time

from ..runner import ownership, procfs, warm
from .shmfiles import held_shm
from .shmwatch import PollingMeter

__all__ = ["RunShmMeter"]

#: a process this young may not have exec'd yet (its environ is still its parent's): asked again next sample
SETTLED_S = 0.5


class RunShmMeter(PollingMeter):
    """Poll the /dev/shm held by this process's lab runs (see the module); a context manager around a run.
    ``peak`` is the highest total seen, in bytes (sampled: a lower bound), ``runs_seen`` the runs' processes."""

    def __init__(self, interval: float = 0.01):
        super().__init__(interval, "run-shm-meter")
        self.reason = None if os.path.isdir("/proc/self/fd") and os.path.isdir("/dev/shm") else (
            "no /proc or no /dev/shm on this machine (macOS?): a run's /dev/shm files cannot be found there")
        self.supported = self.reason is None
        self.mark = tuple(int(x) for x in warm.runner_mark().split(".")) if self.supported else None
        self.peak_total = 0 if self.supported else None
        self.runs_seen: set = set()
        self._known: dict = {}  # pid in the last listing -> (one of our runs' processes?, answer final?)

    def _ours(self, pid: str) -> bool:
        """Whether pid is a process of this runner's runs (the warm template itself is not: it runs nothing).
        Asked once per process, from its environment; again while it is young (a fork not yet exec'd still
        has its parent's environment) and when its pid went from one listing to the next."""
        known = self._known.get(pid)
        if known is not None and known[1]:
            return known[0]
        ticks = procfs.start_ticks(int(pid))
        ours = any(mark == self.mark for mark in ownership.runner_marks(int(pid)).values()) \
            and int(pid) != warm.template_pid()
        settled = ours or (ticks is not None and time.time() - procfs.start_wall(ticks) > SETTLED_S)
        self._known[pid] = (ours, settled)
        if ours:
            self.runs_seen.add((int(pid), ticks))
        return ours

    def read(self) -> int:
        listing = [name for name in os.listdir("/proc") if name.isdigit()]
        self._known = {pid: self._known[pid] for pid in listing if pid in self._known}
        return held_shm([pid for pid in listing if self._ours(pid)])

    def __str__(self) -> str:
        if not self.supported:
            return f"RunShmMeter: unsupported - {self.reason}"
        return (f"RunShmMeter: peak {self.peak / 2**20:.1f} MiB in {self.samples} samples, "
                f"{len(self.runs_seen)} processes of this runner's runs seen")
