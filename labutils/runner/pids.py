"""A limit on the number of processes of one isolated run, so that a fork can really be refused.

Two mechanisms, tried in this order:

* **a child cgroup of the lab's own pids cgroup**, made and joined as the memory one is (``cgroup``),
  where the lab may create one: its ``pids.max`` counts the run's tasks only.
* **RLIMIT_NPROC** for a user other than root (root ignores it): the kernel counts every task of the
  user, so the soft limit is set to the user's tasks now plus the run's allowance; the user's other
  processes starting meanwhile take from the same allowance.

Both count threads as well as processes (the kernel counts tasks). Where neither is available,
:func:`prepare` says why and the run is reported ``unsupported``.
"""

from __future__ import annotations

import os
from typing import Optional

from .cgroup import RunCgroup, make_child
from .cgroupfs import own_cgroup, read_file

#: The smallest allowance: the run's main process and its few threads must start.
MIN_MAX_PROCESSES = 2


def _own_pids_cgroup() -> tuple:
    """``(version, directory)`` of this process's pids cgroup, or ``(None, reason)``."""
    version, where = own_cgroup("pids")
    if version == 2 and "pids" not in (read_file(os.path.join(where, "cgroup.subtree_control")) or "").split():
        return None, f"cgroup v2: the pids controller is not enabled for children of {where}"
    return version, where


def _child_group(limit: int) -> tuple:
    version, parent = _own_pids_cgroup()
    if version is None:
        return None, parent
    return make_child(parent, "pids", version, limit, [("pids.max", str(limit))])


def user_tasks(uid: int) -> int:
    """Tasks (processes and threads) of ``uid`` now, as RLIMIT_NPROC counts them."""
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid == uid:
                count += len(os.listdir(f"/proc/{name}/task"))
        except OSError:
            continue
    return count


def _rlimit_nproc(limit: int) -> tuple:
    try:
        import resource
    except ImportError:
        return None, "no resource module (not a POSIX system)"
    if os.geteuid() == 0:
        return None, "RLIMIT_NPROC does not bind root (the kernel lets root exceed it)"
    if not os.path.isdir("/proc/self/task"):
        return None, "RLIMIT_NPROC counts all of your processes, and without /proc the lab cannot count them"
    _soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    value = user_tasks(os.getuid()) + limit
    if hard != resource.RLIM_INFINITY and value > hard:
        return None, f"RLIMIT_NPROC: your processes now plus {limit} exceed the hard limit of {hard}"
    return value, None


def prepare(limit: int) -> tuple:
    """``(plan, None)`` or ``(None, reason)``; ``plan`` holds ``mechanism`` and ``group`` or ``nproc``."""
    group, why_cgroup = _child_group(limit)
    if group is not None:
        return {"mechanism": group.mechanism, "group": group, "nproc": None}, None
    nproc, why_rlimit = _rlimit_nproc(limit)
    if nproc is not None:
        return {"mechanism": f"RLIMIT_NPROC={nproc} (your {nproc - limit} tasks now + {limit})", "group": None,
                "nproc": nproc}, None
    return None, f"{why_cgroup}; {why_rlimit}"


def refused(group: RunCgroup) -> Optional[int]:
    """The forks the group's ``pids.max`` refused so far (``pids.events``), for the run's record."""
    events = (read_file(os.path.join(group.directory, "pids.events")) or "").split()
    return int(events[1]) if len(events) == 2 and events[0] == "max" and events[1].isdigit() else None
