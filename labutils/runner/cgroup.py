"""A memory-limited cgroup for one isolated run, so that the kernel's own OOM killer enforces the budget.

Two ways, tried in this order:

* **a child cgroup of the lab's own cgroup** (the path in ``/proc/self/cgroup``), where the lab may create
  one: cgroup v1 ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where swap is accounted),
  as root in a container or VM on a v1 or hybrid host; cgroup v2 ``memory.max`` and ``memory.swap.max``,
  which in practice works only where the lab runs in the root cgroup. On v2, a cgroup that holds
  processes (the lab's own does: it holds the lab) cannot also hand the memory controller to children
  (the "no internal processes" rule), and the lab does not move itself or enable controllers, so on a v2
  container, VM or desktop this way is refused with that reason and the next one is tried. The run's
  main process writes its own pid into the group's ``cgroup.procs`` as the bootstrap's first act; the
  group is removed after the run, once every process in it is dead.
  Nothing else is written: no other cgroup file, no group anywhere but under the lab's own.
* **a transient systemd scope** on cgroup v2 desktops without root: the run's command is prefixed with
  ``systemd-run --user --scope -p MemoryMax=... -p MemorySwapMax=0``; systemd removes the scope.

Where neither works, :func:`prepare` says why, and the runner falls back to its watchdog.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
import uuid
from typing import Optional

from . import capabilities as _caps
from .cgroupfs import creator_tag, own_cgroup, proc_cgroups, read_file, unified_directory, write_file

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _keyed(text: Optional[str]) -> dict:
    out = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


class RunCgroup:
    """One run's child cgroup (``kind="child"``) or systemd scope (``kind="systemd"``)."""

    def __init__(self, kind: str, version: int, directory: Optional[str], limit: int, mechanism: str,
                 prefix: Optional[list] = None, unit: Optional[str] = None, limit_file: Optional[str] = None):
        self.kind, self.version, self.directory, self.limit = kind, version, directory, limit
        self.mechanism, self.prefix, self.unit = mechanism, prefix or [], unit
        self.limit_file = limit_file or ("memory.limit_in_bytes" if version == 1 else "memory.max")
        self.last_record: Optional[dict] = None
        #: None until the limit file was read back; then True (it holds the limit) or False (see ``why``)
        self.verified: Optional[bool] = None
        self.why: Optional[str] = None

    def verify(self) -> Optional[bool]:
        """Read the group's limit file back: True when the kernel holds ``limit`` there (to a page), False
        when it holds something else or nothing; None while the directory is not known yet."""
        if self.directory is None:
            return None
        path = os.path.join(self.directory, self.limit_file)
        text = (read_file(path) or "").strip()
        if text.isdigit() and abs(int(text) - self.limit) < _PAGE:
            self.verified, self.why = True, None
        else:
            self.verified = False
            self.why = (f"{path} reads {text or 'nothing'}, not {self.limit}: the kernel does not enforce the "
                        "limit there (memory on cgroup v1, or the controller not delegated)")
        return self.verified

    @property
    def procs_file(self) -> Optional[str]:
        """The file the run's main process writes its pid into (None for a systemd scope: already in)."""
        return os.path.join(self.directory, "cgroup.procs") if self.kind == "child" else None

    def locate(self, pid: int) -> None:
        """For a systemd scope: find its directory from the run's main process once systemd has moved it
        into the run's own unit (``<unit>.scope``; until then the process is still in the kernel's group,
        often a terminal's ``*.scope``, which is not the run's), then read its limit back."""
        if self.directory is not None or not self.unit:
            return
        for hid, controllers, path in proc_cgroups(pid) or []:
            if hid == "0" and not controllers and path.endswith("/" + self.unit + ".scope"):
                self.directory = unified_directory(path)
                if self.directory is not None:
                    self.verify()
                return

    def record(self) -> Optional[dict]:
        """The kernel's counters for the group now (kept: a systemd scope vanishes with its processes)."""
        if self.directory is None:
            return self.last_record
        if self.version == 1:
            oom = _keyed(read_file(os.path.join(self.directory, "memory.oom_control")))
            failcnt = read_file(os.path.join(self.directory, "memory.failcnt"))
            peak = read_file(os.path.join(self.directory, "memory.max_usage_in_bytes"))
            if failcnt is None:
                return self.last_record
            memsw = read_file(os.path.join(self.directory, "memory.memsw.failcnt"))
            record = {"source": "memory.oom_control, memory.failcnt", "oom_kill": oom.get("oom_kill", 0),
                      "under_oom": oom.get("under_oom"), "failcnt": int(failcnt),
                      "memsw_failcnt": int(memsw) if memsw and memsw.strip().isdigit() else None,
                      "max_usage": int(peak) if peak and peak.strip().isdigit() else None}
        else:
            events = read_file(os.path.join(self.directory, "memory.events"))
            if events is None:
                return self.last_record
            counts = _keyed(events)
            peak = read_file(os.path.join(self.directory, "memory.peak"))
            record = {"source": "memory.events", "oom_kill": counts.get("oom_kill", 0),
                      "oom": counts.get("oom", 0), "max": counts.get("max", 0),
                      "max_usage": int(peak) if peak and peak.strip().isdigit() else None}
        self.last_record = record
        return record

    def pids(self) -> list:
        if self.directory is None:
            return []
        text = read_file(os.path.join(self.directory, "cgroup.procs")) or ""
        return [int(x) for x in text.split() if x.isdigit()]

    def contains(self, pid: int) -> bool:
        """Is ``pid`` in this group now (from /proc/PID/cgroup)?"""
        if self.directory is None:
            return False
        tail = "/" + os.path.basename(self.directory)
        for _hid, controllers, path in proc_cgroups(pid) or []:
            if path.endswith(tail) and (self.version == 2 or bool(set(controllers) & {"memory", "pids"})):
                return True
        return False

    def remove(self, timeout: float = 3.0) -> Optional[str]:
        """Remove the child group once its processes are gone; return an error text if it stays."""
        if self.kind != "child" or self.directory is None:
            return None
        deadline = time.monotonic() + timeout
        while True:
            try:
                os.rmdir(self.directory)
                return None
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    return f"could not remove {self.directory}: {exc.strerror}"
            time.sleep(0.02)


def prepare(limit: int) -> tuple:
    """Make the run's memory-limited group: ``(RunCgroup, None)``, or ``(None, reason)`` where impossible."""
    version, where = own_cgroup("memory")
    reasons = []
    if version is not None:
        group, reason = _child_group(version, where, limit)
        if group is not None:
            return group, None
        reasons.append(reason)
    else:
        reasons.append(where)
    group, reason = _systemd_scope(limit, version)
    if group is not None:
        return group, None
    reasons.append(reason)
    return None, "; ".join(r for r in reasons if r)


def _child_group(version: int, parent: str, limit: int) -> tuple:
    if version == 2:
        control = (read_file(os.path.join(parent, "cgroup.subtree_control")) or "").split()
        if "memory" not in control:
            return None, (f"cgroup v2: the memory controller is not enabled for children of {parent}; a "
                          "cgroup that holds processes (this one holds the lab) cannot enable it, and the lab "
                          "writes no cgroup file but its own run's")
    # no swap either, where the kernel has the file: the limit is the memory, as on a server
    files = [("memory.limit_in_bytes", str(limit)), ("memory.memsw.limit_in_bytes", str(limit))] if version == 1 \
        else [("memory.max", str(limit)), ("memory.swap.max", "0")]
    return make_child(parent, "run", version, limit, files)


def make_child(parent: str, kind: str, version: int, limit: int, files: list) -> tuple:
    """``(RunCgroup, None)`` for a new lab cgroup ``labutils-KIND-<creator>-<nonce>`` under ``parent`` whose
    first ``(file, value)`` of ``files`` holds ``limit`` (read back), the others written where the kernel
    has them; else ``(None, reason)``, and the directory is removed again."""
    directory = os.path.join(parent, f"labutils-{kind}-{creator_tag()}-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(directory)
    except OSError as exc:
        return None, f"cannot create a child cgroup under {parent}: {exc.strerror}"
    written = []
    for name, value in files:
        path = os.path.join(directory, name)
        if written and not os.path.exists(path):
            continue
        try:
            write_file(path, value)
        except OSError as exc:
            try:
                os.rmdir(directory)
            except OSError:
                pass
            return None, f"cannot set {name} on a child cgroup under {parent}: {exc.strerror}"
        written.append(name)
    group = RunCgroup("child", version, directory, limit, f"cgroup v{version} child " + " + ".join(written),
                      limit_file=files[0][0])
    if not group.verify():
        group.remove()
        return None, f"a child cgroup under {parent} does not hold {files[0][0]}: {group.why}"
    return group, None


def _systemd_scope(limit: int, version: Optional[int]) -> tuple:
    if version == 1:
        return None, "memory is on cgroup v1 here, where systemd's MemoryMax= limits nothing"
    cap = _caps.systemd_scope()
    if not cap.available:
        return None, f"systemd-run --user --scope: {cap.result}"
    tool = shutil.which("systemd-run") or "systemd-run"
    unit = f"labutils-run-{creator_tag()}-{uuid.uuid4().hex[:8]}"
    prefix = [tool, "--user", "--scope", "--quiet", "--collect", f"--unit={unit}",
              "-p", f"MemoryMax={limit}", "-p", "MemorySwapMax=0", "--"]
    return RunCgroup("systemd", 2, None, limit, "systemd-run --user --scope MemoryMax + MemorySwapMax=0",
                     prefix, unit=unit), None


def kernel_log_reader():
    """An open /dev/kmsg positioned at its end (None where unreadable): the kernel's lines from now on."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        os.close(fd)
        return None
    return fd


def read_kernel_log(fd) -> list:
    """Messages written to the kernel log since :func:`kernel_log_reader` (closes the fd)."""
    out = []
    if fd is None:
        return out
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while we read: skip on
                    continue
                break
            if not record:
                break
            head, _, message = record.decode("utf-8", "replace").partition(";")
            out.append(message.split("\n", 1)[0])
    finally:
        os.close(fd)
    return out
