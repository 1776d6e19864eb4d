"""Readers of cgroup facts: ``/proc/PID/cgroup``, this process's mounts, the files of a cgroup directory,
and the identity tag a lab group is named with. The bottom layer under ``capabilities``, ``cgroup`` and
``pids``: it holds no policy and imports only ``procfs``."""

from __future__ import annotations

import os
from typing import Optional

from .procfs import start_ticks


def read_file(path: str) -> Optional[str]:
    """A cgroup (or /proc) file's text, or None where it cannot be read."""
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read()
    except OSError:
        return None


def write_file(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(value)


def mountinfo() -> list:
    """``/proc/self/mountinfo`` as dicts of ``root``, ``mount``, ``fstype`` and ``options`` ([] unreadable)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3:
            out.append({"root": fields[3], "mount": fields[4], "fstype": tail[0], "options": tail[2]})
    return out


def proc_cgroups(pid="self") -> Optional[list]:
    """``/proc/PID/cgroup`` as ``[(hierarchy id, [controllers], path)]``, or None where unreadable: the one
    parser of that file (v1 lines name their controllers; the v2 line is ``0::PATH``)."""
    text = read_file(f"/proc/{pid}/cgroup")
    if text is None:
        return None
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[0], [c for c in parts[1].split(",") if c], parts[2]))
    return out


def join(mount: dict, path: str) -> str:
    """The directory of cgroup ``path`` (as ``/proc/PID/cgroup`` names it) under ``mount``: inside a cgroup
    namespace the path starts at the namespace's root, which the mount says where it is."""
    root = mount["root"]
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return os.path.join(mount["mount"], path.lstrip("/"))


def unified_directory(path: str, mounts: Optional[list] = None) -> Optional[str]:
    """The directory of a cgroup v2 ``path``, or None where no cgroup2 file system is mounted."""
    for m in mountinfo() if mounts is None else mounts:
        if m["fstype"] == "cgroup2":
            return join(m, path)
    return None


def own_cgroup(controller: str) -> tuple:
    """``(version, directory)`` of this process's ``controller`` cgroup, or ``(None, reason)``. Under cgroup
    v2 the controller must be available there (``cgroup.controllers``)."""
    entries = proc_cgroups()
    if entries is None:
        return None, "no /proc/self/cgroup (not Linux, or /proc is not mounted)"
    mounts = mountinfo()
    for _hid, controllers, path in entries:
        if controller in controllers:
            for m in mounts:
                if m["fstype"] == "cgroup" and controller in m["options"].split(","):
                    return 1, join(m, path)
            return None, f"the {controller} controller (cgroup v1) is not mounted here"
    for hid, controllers, path in entries:
        directory = unified_directory(path, mounts) if hid == "0" and not controllers else None
        if directory is not None:
            if controller not in (read_file(os.path.join(directory, "cgroup.controllers")) or "").split():
                return None, f"the {controller} controller is not available in {directory}"
            return 2, directory
    return None, f"this process is in no {controller} cgroup"


def creator_tag() -> str:
    """``PID.TICKS`` of this process: who made a group or run directory, by identity (a pid number alone
    could be someone else's by the time it is read)."""
    return f"{os.getpid()}.{start_ticks(os.getpid())}"
