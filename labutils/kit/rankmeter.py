"""Notebook 12's /dev/shm meter: the shared memory that this process's lab runs hold, found by identity.

:class:`labutils.kit.shmwatch.PeakMeter` reads the use of the whole ``/dev/shm`` filesystem, which every
other program on the machine shares: on a busy machine its peak is not the run's. :class:`RunShmMeter`
counts only the ``/dev/shm`` files that the processes of *this* runner's lab runs map or hold open, found
from ``/proc`` alone:

* a process is a run's when its environment (``/proc/PID/environ``, as it was started) carries this
  process's runner mark (``LABUTILS_RUNNER`` or the warm template's ``LABUTILS_TEMPLATE``: this pid and its
  start time), which every process of a run inherits: the torchrun agent, its ranks and their workers;
* a file is counted once by its inode, whoever maps it (``/proc/PID/maps``) or holds it open
  (``/proc/PID/fd``, where a batch waits between the worker that made it and the process that takes it), at
  its size. PyTorch unlinks its segments at once, so they have no name to list: these two are where they are.

The peak is sampled (every ``interval`` seconds), so it is a lower bound. Linux only: elsewhere
``supported`` is False and ``peak`` None, as with :class:`~labutils.kit.shmwatch.PeakMeter`.
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
    """Poll the /dev/shm held by this process's lab runs (see the module) in a daemon thread; keep the peak.

    Use it as a context manager around a run (``run_isolated``, ``run_torchrun``): ``peak`` is the highest
    total seen, in bytes, and ``runs_seen`` how many processes were found to be the runs'. Another program's
    files, however many, are not counted; a run of another runner (a second kernel) neither.
    """

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
