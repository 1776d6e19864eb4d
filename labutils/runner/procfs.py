"""Readers of what the kernel says about processes: ``/proc/PID/*`` figures (start time, memory, fds),
the process tree and wait statuses. What a run writes is read by :mod:`labutils.runner.rundir`."""

from __future__ import annotations

import os
import time
from typing import Optional

import psutil

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def stat_fields(pid: int) -> Optional[list]:
    """``/proc/PID/stat`` from field 3 (state) on, or None: ``[state, ppid, pgrp, ...]``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> Optional[int]:
    fields = stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def start_wall(ticks: int) -> float:
    """Wall-clock time of a process start given in clock ticks since boot (10 ms resolution)."""
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else None
    if since_boot is None:  # pragma: no cover - non-Linux
        return 0.0
    return time.time() - (since_boot - ticks / _CLK_TCK)


def zombie_status(pid: int) -> Optional[int]:
    """The wait status of a zombie (``/proc/PID/stat`` field 52), or None if it is not a readable zombie."""
    fields = stat_fields(pid)
    if not fields or fields[0] != b"Z" or len(fields) < 50:
        return None
    try:
        return int(fields[49])
    except ValueError:
        return None


def _rss(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def _rollup(pid: int) -> Optional[dict]:
    """Rss, Pss, Private_* and Shared_* of a process in bytes (``/proc/PID/smaps_rollup``), or None."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            lines = fh.read().splitlines()[1:]
    except OSError:
        return None
    out = {}
    for line in lines:
        key, _, rest = line.partition(b":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.decode()] = int(parts[0]) * 1024
    if "Pss" not in out:
        return None
    out["Uss"] = out.get("Private_Clean", 0) + out.get("Private_Dirty", 0)
    return out


def _oom_score(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/oom_score", "rb") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return 0


def _status_kb(pid: int, key: bytes) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        return None
    return 0


def _num_fds(pid: int) -> Optional[int]:
    """Open descriptors of ``pid``; None when unknown, or when it is exiting (its table already released)."""
    try:
        n = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    return n or None  # a live Python process holds at least stdin/stdout/stderr


def _descendants(root: int) -> list:
    """``root`` and every process below it, from ``/proc/PID/task/TID/children`` (cheap: only the run's
    processes are read), or from psutil's scan of every process where that file does not exist."""
    out, frontier, seen = [], [root], {root}
    while frontier:
        pid = frontier.pop()
        out.append(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                    kids = fh.read().split()
            except FileNotFoundError:
                if pid == root and not os.path.exists(f"/proc/{pid}/task/{tid}/children"):
                    try:
                        return [root, *(c.pid for c in psutil.Process(root).children(recursive=True))]
                    except (psutil.NoSuchProcess, psutil.ZombieProcess):
                        return [root]
                continue
            except OSError:
                continue
            for kid in kids:
                k = int(kid)
                if k not in seen:
                    seen.add(k)
                    frontier.append(k)
    return out


def split_exitcode(code: Optional[int]) -> tuple:
    """A Popen-style exit code (negative: killed by that signal) as ``(exitcode, signal)``."""
    if code is None:
        return None, None
    return (None, -code) if code < 0 else (code, None)
