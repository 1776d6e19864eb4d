"""What this machine lets the runner do, found by trying each thing once (never by ``hasattr``).

A Python build can define ``os.pidfd_open`` while the running kernel (older than 5.3) or a container's
seccomp profile refuses the call; a systemd user manager can accept ``MemoryMax=`` and enforce nothing
(memory on cgroup v1, or not delegated). So each capability is probed by doing it for real, the answer is
cached for the process, and the runner, ``doctor`` and ``result.launcher``/``result.memory_limit`` all read
the same answer: a :class:`Capability`, saying what was tried, what came of it, and which fallback is
active. The slow probes (``systemd_scope``, ``private_shm``: seconds) run only when a run or ``doctor``
needs them.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import asdict, dataclass
from typing import Optional

from .cgroupfs import creator_tag, own_cgroup

_lock = threading.Lock()
_cache: dict = {}


@dataclass
class Capability:
    name: str
    available: bool
    tried: str
    result: str
    #: what the runner does instead when it is missing (None where nothing is needed)
    fallback: Optional[str] = None
    detail: Optional[dict] = None

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        state = "yes" if self.available else "no"
        text = f"{self.name}: {state} - tried {self.tried}: {self.result}"
        return text + (f"; instead: {self.fallback}" if self.fallback and not self.available else "")


def reset() -> None:
    """Forget every cached answer (tests that simulate a machine, then restore it)."""
    with _lock:
        _cache.clear()


def _cached(name: str, probe) -> Capability:
    with _lock:
        cap = _cache.get(name)
    if cap is None:
        cap = probe()
        with _lock:
            cap = _cache.setdefault(name, cap)
    return cap


def pidfd() -> Capability:
    return _cached("pidfd", _probe_pidfd)


def has_pidfd() -> bool:
    return pidfd().available


def _probe_pidfd() -> Capability:
    tried = "os.pidfd_open(os.getpid()) and signal.pidfd_send_signal(fd, 0)"
    fallback = ("processes are tracked by pid plus start time (/proc/PID/stat), checked again before each "
                "signal; the warm launcher is off")
    opener = getattr(os, "pidfd_open", None)
    sender = getattr(signal, "pidfd_send_signal", None)
    if opener is None or sender is None:
        return Capability("pidfd", False, tried, "this Python has no pidfd functions", fallback)
    try:
        fd = opener(os.getpid())
    except OSError as exc:
        why = {errno.ENOSYS: "the kernel has no pidfd_open (older than Linux 5.3)",
               errno.EPERM: "refused (a seccomp profile, e.g. an old Docker)"}.get(exc.errno, str(exc))
        return Capability("pidfd", False, tried, f"{errno.errorcode.get(exc.errno, exc.errno)}: {why}", fallback)
    try:
        sender(fd, 0)
    except OSError as exc:
        return Capability("pidfd", False, tried, f"pidfd_send_signal failed: {exc}", fallback)
    finally:
        os.close(fd)
    return Capability("pidfd", True, tried, "works", fallback)


def kmsg() -> Capability:
    return _cached("kmsg", _probe_kmsg)


def _probe_kmsg() -> Capability:
    tried = "open('/dev/kmsg', O_RDONLY | O_NONBLOCK)"
    fallback = "an OOM kill is attributed from the cgroup's oom_kill count and the exit statuses"
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return Capability("kmsg", False, tried, exc.strerror or str(exc), fallback)
    os.close(fd)
    return Capability("kmsg", True, tried, "readable", fallback)


def cgroup(controller: str) -> Capability:
    """``controller`` is ``"memory"`` or ``"pids"``."""
    return _cached("cgroup_" + controller, lambda: _probe_cgroup(controller))


def _probe_cgroup(controller: str) -> Capability:
    name = "cgroup_" + controller
    fallback = {"memory": "the lab's watchdog enforces memory_budget (or a systemd scope, where it enforces)",
                "pids": "RLIMIT_NPROC for a user other than root; else max_processes is unsupported"}[controller]
    version, where = own_cgroup(controller)
    if version is None:
        return Capability(name, False, f"find this process's {controller} cgroup", where, fallback)
    tried = f"mkdir and rmdir of a child group in {where} (cgroup v{version})"
    probe = os.path.join(where, f"labutils-probe-{creator_tag()}-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        return Capability(name, False, tried, exc.strerror or str(exc), fallback,
                          {"version": version, "directory": where, "writable": False})
    try:
        os.rmdir(probe)
    except OSError:
        pass
    return Capability(name, True, tried, "a child group can be made", fallback,
                      {"version": version, "directory": where, "writable": True})


def systemd_scope() -> Capability:
    return _cached("systemd_scope", _probe_systemd)


_SCOPE_PROBE = ("p=$(grep '^0::' /proc/self/cgroup | cut -d: -f3); "
                "cat /sys/fs/cgroup\"$p\"/memory.max 2>/dev/null || echo missing")


def _probe_systemd() -> Capability:
    tried = "systemd-run --user --scope -p MemoryMax=64M, reading memory.max back inside the scope"
    fallback = "the lab's watchdog enforces memory_budget"
    tool = shutil.which("systemd-run")
    if tool is None:
        return Capability("systemd_scope", False, tried, "systemd-run is not installed", fallback)
    cmd = [tool, "--user", "--scope", "--quiet", "-p", "MemoryMax=64M", "-p", "MemorySwapMax=0",
           "sh", "-c", _SCOPE_PROBE]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Capability("systemd_scope", False, tried, str(exc), fallback)
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["failed"]
        return Capability("systemd_scope", False, tried, f"refused: {why[0]}", fallback)
    return systemd_verdict(done.stdout.strip(), 64 * 2**20, tried, fallback)


def systemd_verdict(read_back: str, limit: int, tried: str, fallback: str) -> Capability:
    """The verdict on a scope whose ``memory.max`` read back as ``read_back`` for a limit of ``limit``."""
    if read_back == str(limit):
        return Capability("systemd_scope", True, tried, f"memory.max reads {read_back}: the kernel enforces it",
                          fallback)
    return Capability("systemd_scope", False, tried, f"systemd accepted MemoryMax but the scope's memory.max "
                      f"reads {read_back or 'nothing'} (memory is on cgroup v1, or not delegated): it enforces "
                      "nothing", fallback)


def private_shm() -> Capability:
    return _cached("private_shm", _probe_private_shm)


def _probe_private_shm() -> Capability:
    tried = "unshare --mount (then --user --map-root-user) mounting a 1 MiB tmpfs on /dev/shm"
    fallback = "a run with shm_size= is reported unsupported"
    if not sys.platform.startswith("linux"):
        return Capability("private_shm", False, tried, f"needs Linux mount namespaces; this is {sys.platform}",
                          fallback)
    unshare = shutil.which("unshare")
    if unshare is None:
        return Capability("private_shm", False, tried, "the `unshare` command (util-linux) is not installed",
                          fallback)
    errors = []
    for extra in ([], ["--user", "--map-root-user"]):
        prefix = [unshare, *extra, "--mount", "--propagation", "private"]
        try:
            done = subprocess.run(prefix + ["sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                                  capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(str(exc))
            continue
        if done.returncode == 0:
            return Capability("private_shm", True, tried, "works with " + " ".join(prefix[1:]), fallback,
                              {"prefix": prefix})
        errors.append(((done.stderr or done.stdout).strip().splitlines() or ["failed"])[-1])
    return Capability("private_shm", False, tried, f"this machine does not allow a private mount namespace "
                      f"(unshare: {errors[-1]}); run as root, enable unprivileged user namespaces, or skip "
                      "this run", fallback)


def probe_all(expensive: bool = True) -> list:
    """Every capability (the slow systemd and unshare probes only with ``expensive``), for ``doctor``."""
    caps = [pidfd(), cgroup("memory"), cgroup("pids"), kmsg()]
    if expensive:
        caps[3:3] = [systemd_scope()]
        caps.append(private_shm())
    return caps


def doctor_check(expensive: bool = False) -> dict:
    """The ``runner`` line of ``doctor``: each capability, what was tried, the result and the active fallback
    (the keywords of a ``CheckResult``). Only a missing pidfd is a warning: the rest have fallbacks that
    keep every lesson working."""
    caps = probe_all(expensive)
    if not expensive:
        caps += [c for c in (_cache.get("systemd_scope"), _cache.get("private_shm")) if c is not None]
    detail = "; ".join(c.line() for c in caps)
    if not expensive and len(caps) < 6:
        detail += "; systemd scope and private /dev/shm not probed (labutils doctor --runner probes them)"
    pid = caps[0]
    advice = None if pid.available else ("the lab still works, but the warm launcher is off and processes are "
                                         "tracked by start time; a kernel >= 5.3 (and Docker >= 20.10) has pidfds")
    return {"name": "runner", "status": "OK" if pid.available else "WARN", "detail": detail, "advice": advice,
            "data": {"capabilities": [c.to_dict() for c in caps]}}
