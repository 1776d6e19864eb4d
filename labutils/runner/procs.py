"""Which processes belong to one isolated run, and signalling only those.

A process is the run's when the lab started it (the main process, a child of the lab that is not reaped
until the end) or when it is verified, at the moment the runner holds a handle on it, to

* descend from the main process (its parent chain in ``/proc`` reaches the un-reaped main process), or
* belong to the main process's session (the main process starts one; an orphan keeps it), or
* carry this run's unique ``LABUTILS_RUN_DIR`` in the environment it was started with, or
* sit in the run's own cgroup.

The handle is a pidfd (Linux >= 5.3): signals go through it, so a pid recycled by someone else can never
be hit. The check is made after the pidfd is open and while the process is alive, so the number checked is
the process the handle holds. Where pidfds do not work (``capabilities.pidfd``: tried, not assumed), the
start time in ``/proc/PID/stat`` is checked again right before each signal (a window of microseconds
between the check and the signal remains, as in psutil).

The rules that trust the main process's *number* (its session, its descendants, its process group) hold
only while it is not reaped: its un-reaped zombie keeps the number. That is checked through its pidfd (a
null signal succeeds for a zombie and fails once it is reaped) or, without one, its start time.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import threading
import time
from typing import Optional

from . import capabilities as _caps
from .procfs import start_ticks, stat_fields

HELPER_NAMES = ("torch_shm_manager",)
HELPER_CMDLINE = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


class RunProcess:
    __slots__ = ("pid", "ticks", "pidfd", "name", "helper")

    def __init__(self, pid, ticks, pidfd, name, helper):
        self.pid, self.ticks, self.pidfd, self.name, self.helper = pid, ticks, pidfd, name, helper


class RunProcesses:
    """The verified processes of one run, with a handle on each. Without a ``leader_pid`` (a run whose
    runner is gone), its processes are known by the run's environment marker alone."""

    def __init__(self, run_dir: str, leader_pid: Optional[int], cgroup=None):
        self.leader = leader_pid
        self.marker = b"LABUTILS_RUN_DIR=" + os.fsencode(run_dir) + b"\0"
        self.cgroup = cgroup
        self.known: dict = {}
        self.refused: dict = {}  # pid -> start ticks of processes checked and found not ours
        self.stopped: set = set()  # pids that :meth:`terminate` found alive beside or after the main process
        self.lock = threading.Lock()
        self._leader_ticks = None if leader_pid is None else start_ticks(leader_pid)
        if leader_pid is not None:
            self.adopt(leader_pid)

    def leader_unreaped(self) -> bool:
        """Is the main process still un-reaped (alive or a zombie), so that its number is still its own?"""
        if self.leader is None:
            return False
        leader = self.known.get(self.leader)
        fd = leader.pidfd if leader is not None else None
        if fd is not None:
            try:
                signal.pidfd_send_signal(fd, 0)
                return True
            except ProcessLookupError:
                return False
            except OSError:
                pass
        return self._leader_ticks is not None and start_ticks(self.leader) == self._leader_ticks

    def _environ_marked(self, pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                return self.marker in fh.read()
        except OSError:
            return False

    def _in_session(self, pid: int) -> bool:
        fields = stat_fields(pid)
        try:
            return bool(fields) and int(fields[3]) == self.leader and self.leader_unreaped()
        except (IndexError, ValueError):
            return False

    def _descends(self, pid: int) -> bool:
        if not self.leader_unreaped():
            return False
        seen = 0
        while pid > 1 and seen < 64:
            if pid == self.leader:
                return True
            fields = stat_fields(pid)
            if not fields:
                return False
            pid, seen = int(fields[1]), seen + 1
        return False

    def adopt(self, pid: int, ticks: Optional[int] = None) -> Optional[RunProcess]:
        """Take a handle on ``pid`` if it is verifiably the run's (and started at ``ticks``, if given)."""
        with self.lock:
            proc = self.known.get(pid)
            if proc is not None:
                return proc
            now_ticks = start_ticks(pid)
            if now_ticks is None or (ticks is not None and ticks != now_ticks):
                return None
            if self.refused.get(pid) == now_ticks:
                return None
            pidfd = None
            if _caps.has_pidfd():
                try:
                    pidfd = os.pidfd_open(pid)
                except OSError as exc:
                    if exc.errno == errno.ESRCH:
                        return None  # gone already
                    pidfd = None  # out of fds, say: the start-time path below still identifies it
            ok = start_ticks(pid) == now_ticks and not self._exited_fd(pidfd)
            if ok and pid != self.leader:
                ok = self._descends(pid) or self._in_session(pid) or self._environ_marked(pid) or bool(
                    self.cgroup is not None and self.cgroup.contains(pid))
            if not ok:
                if pidfd is not None:
                    os.close(pidfd)
                self.refused[pid] = now_ticks
                return None
            name, helper, _named = _identify(pid)
            proc = self.known[pid] = RunProcess(pid, now_ticks, pidfd, name, helper)
            return proc

    @staticmethod
    def _exited_fd(pidfd: Optional[int]) -> bool:
        if pidfd is None:
            return False
        poller = select.poll()  # not select(): fd numbers above 1023 are fine
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(0))

    def sweep(self) -> None:
        """Adopt every live process carrying this run's marker or sitting in its cgroup."""
        candidates = set(self.cgroup.pids()) if self.cgroup is not None else set()
        try:
            entries = os.listdir("/proc")
        except OSError:
            entries = []
        for entry in entries:
            if entry.isdigit():
                pid = int(entry)
                if pid not in self.known and (pid in candidates or self._in_session(pid)
                                              or self._environ_marked(pid)):
                    candidates.add(pid)
        for pid in candidates:
            self.adopt(pid)

    def alive(self, proc: RunProcess) -> bool:
        if proc.pidfd is not None:
            if self._exited_fd(proc.pidfd):
                return False
            fields = stat_fields(proc.pid)
            return bool(fields) and fields[0] != b"Z"
        fields = stat_fields(proc.pid)
        try:
            return bool(fields) and fields[0] != b"Z" and int(fields[19]) == proc.ticks
        except (IndexError, ValueError):
            return False

    def send(self, proc: RunProcess, sig: int) -> bool:
        try:
            if proc.pidfd is not None:
                signal.pidfd_send_signal(proc.pidfd, sig)
            else:
                if start_ticks(proc.pid) != proc.ticks:
                    return False
                os.kill(proc.pid, sig)
            return True
        except (ProcessLookupError, PermissionError, OSError):
            return False

    def living(self) -> list:
        with self.lock:
            procs = list(self.known.values())
        return [p for p in procs if self.alive(p)]

    def terminate(self, helper_grace: float = 5.0) -> list:
        """SIGKILL every process of the run, the run's clean-up helpers last; return pids still alive.

        The processes other than the main process found alive here (they outlived it) go to ``stopped``:
        under python they would have gone on alone (a DataLoader worker ends itself within 5 s of finding
        its parent gone); the lab stops them, and says so in their record.

        Helpers (multiprocessing's resource tracker and fork server, torch_shm_manager) end by themselves once
        every other process of the run is gone: they unlink what the run registered with them, and the fork
        server runs the exit handlers of the script it preloaded. They get ``helper_grace`` seconds to do
        that. (A longer grace widens the window in which a warm run's helpers, alive after its main process,
        look like strays to another session's ``find_strays``.) The main process's group is killed only
        while it is un-reaped (see the module's docstring).
        """
        for _round in range(2):
            self.sweep()
            for proc in self.living():
                if not proc.helper and not self._became_helper(proc):
                    if proc.pid != self.leader:
                        self.stopped.add(proc.pid)
                    self.send(proc, signal.SIGKILL)
        deadline = time.monotonic() + helper_grace
        while time.monotonic() < deadline:
            others = [p for p in self.living() if not p.helper]
            helpers = [p for p in self.living() if p.helper]
            if not helpers:
                break
            for proc in others:
                self.send(proc, signal.SIGKILL)
            time.sleep(0.02)
        if self.leader_unreaped():
            try:
                os.killpg(self.leader, signal.SIGKILL)  # the leader is not reaped: the group is ours
            except (ProcessLookupError, PermissionError):
                pass
        self.sweep()
        for proc in self.living():
            self.send(proc, signal.SIGKILL)
        deadline = time.monotonic() + 3.0
        left = self.living()
        while left and time.monotonic() < deadline:
            time.sleep(0.02)
            left = [p for p in left if self.alive(p)]
        return [p.pid for p in left if p.pid != self.leader]

    def _became_helper(self, proc) -> bool:
        """Is ``proc`` a helper after all? One adopted between its fork and its exec carried its parent's name
        (torch_shm_manager is exec'd by a worker; on a loaded machine the window is long), so its name is
        read again before it is taken for a process to kill (its pidfd or start time keeps it the same
        process). In its exec it has no command line for a moment: read again until it has one or is gone,
        for half a second at most (a resource tracker killed there, under load, lost its leak warning)."""
        deadline = time.monotonic() + 0.5
        name, helper, named = _identify(proc.pid)
        while not named and time.monotonic() < deadline and self.alive(proc):
            time.sleep(0.01)
            name, helper, named = _identify(proc.pid)
        if helper:
            proc.name, proc.helper = name, True
        return helper

    def close(self) -> None:
        with self.lock:
            for proc in self.known.values():
                if proc.pidfd is not None:
                    try:
                        os.close(proc.pidfd)
                    except OSError:
                        pass
                    proc.pidfd = None


def _identify(pid: int) -> tuple:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            name = fh.read().strip()
    except OSError:
        name = ""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        cmdline = ""
    # the kernel keeps 15 characters of a name in comm ("torch_shm_manag"): compare that much
    helper = name in {h[:15] for h in HELPER_NAMES} or any(h in cmdline for h in HELPER_CMDLINE)
    return name, helper, bool(cmdline)
