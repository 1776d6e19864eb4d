"""Run learner code in a fresh Python process, under per-run limits, and collect the evidence.

The Jupyter kernel only starts a child process and watches it: a segfault, an OOM kill, a hang or fd
exhaustion in the learner's loader ends that child, never the kernel. After every run, whatever its
outcome, no process of the run is left alive and no ``/dev/shm`` file it created remains.

The machine may be shared (a JupyterHub, a laptop beside real work, a second lab in the same tree): the
runner signals only processes it can prove are the run's (``_procs``), removes only /dev/shm files the run
created, and makes the kernel enforce a memory budget in a cgroup of the run's own where the OS allows it
(``_cgroup``).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from . import cgroup as _cgroup
from . import pids as _pids
from . import procs as _procs
from . import startmethod as _startmethod
from . import warm as _warm
from .result import ExceptionInfo, ProcessInfo, RunResult
from .sizes import format_size, parse_size

START_METHODS = ("fork", "spawn", "forkserver")
_BOOTSTRAP = str(Path(__file__).with_name("bootstrap.py"))
_CHILD = str(Path(__file__).with_name("child.py"))
_SHM = "/dev/shm"
MIN_MEMORY_BUDGET = 64 * 2**20
MEMORY_ENFORCEMENTS = ("auto", "kernel", "watchdog")
MEMORY_ENFORCEMENT_ENV = "LABUTILS_MEMORY_ENFORCEMENT"


class IsolationError(ValueError):
    """A run_isolated argument the runner cannot honour; the message says what to do.

    For a bad value of one argument, ``argument`` (the Python name, e.g. ``"shm_size"``), ``value`` and
    ``problem`` are set too, so that a front end can name its own option: ``exc.for_option("--shm-size")``.
    """

    def __init__(self, message: str, *, argument: Optional[str] = None, value: Any = None,
                 problem: Optional[str] = None):
        super().__init__(message)
        self.argument, self.value, self.problem = argument, value, problem

    def for_option(self, option: str) -> str:
        """The message with the front end's name for the argument: ``--shm-size 0: is below 64 KiB...``."""
        if self.argument is None or self.problem is None:
            return str(self)
        value = str(self.value)
        return f"{option} {value if value and not any(c.isspace() for c in value) else repr(value)}: {self.problem}"


# --------------------------------------------------------------------------- private /dev/shm
_shm_support: Optional[tuple] = None


def private_shm_support() -> tuple:
    """Return ``(argv_prefix, None)`` if a private /dev/shm can be mounted for a run, else ``(None, reason)``.

    Tries ``unshare --mount`` (root or CAP_SYS_ADMIN), then ``unshare --user --map-root-user --mount``
    (unprivileged user namespaces). The answer is cached for the process.
    """
    global _shm_support
    if _shm_support is not None:
        return _shm_support
    if not sys.platform.startswith("linux"):
        _shm_support = (None, f"a private /dev/shm needs Linux mount namespaces; this is {sys.platform}")
        return _shm_support
    unshare = shutil.which("unshare")
    if unshare is None:
        _shm_support = (None, "the `unshare` command (util-linux) is not installed")
        return _shm_support
    errors = []
    for extra in ([], ["--user", "--map-root-user"]):
        prefix = [unshare, *extra, "--mount", "--propagation", "private"]
        probe = prefix + ["sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {_SHM}"]
        try:
            done = subprocess.run(probe, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(str(exc))
            continue
        if done.returncode == 0:
            _shm_support = (prefix, None)
            return _shm_support
        errors.append((done.stderr or done.stdout).strip().splitlines()[-1:] or ["failed"])
    _shm_support = (None, "this machine does not allow a private mount namespace (unshare: "
                    f"{errors[-1]}); run as root, enable unprivileged user namespaces, or skip this run")
    return _shm_support


# --------------------------------------------------------------------------- process bookkeeping
def _psutil():
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is in requirements.txt
        return None
    return psutil


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


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


def _descendants(root: int, psutil=None) -> list:
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
                if pid == root and not os.path.exists(f"/proc/{pid}/task/{tid}/children") and psutil:
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


class _Tail:
    """New complete JSON lines of a file written by the run, read incrementally."""

    def __init__(self, path: str):
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


def _decode_status(status: Optional[int]) -> tuple:
    """A wait status as ``(exitcode, signal)``; ``(None, None)`` when unknown."""
    if status is None:
        return None, None
    if status & 0x7F:
        return None, status & 0x7F
    return (status >> 8) & 0xFF, None


class _Monitor(threading.Thread):
    """Watches the run: its processes (verified, with a handle each), memory, progress and deaths.

    It enforces the watchdog budget when the kernel does not, detects a stall, keeps peak memory per
    process and, for the live lab, calls ``on_sample``/``on_event``. What it reads each tick depends on who
    needs it: the process tree and each RSS always; PSS/USS only for the watchdog, ``memory_detail`` or a
    listener; fds and shared memory only for a listener.
    """

    def __init__(self, procs, run_dir: str, interval: float, watchdog_budget: Optional[int], detail: bool,
                 cgroup=None, stall: Optional[float] = None, on_sample=None, on_event=None, wake=None):
        super().__init__(daemon=True, name=f"labutils-monitor-{procs.leader}")
        self.procs, self.pid = procs, procs.leader
        self.interval, self.budget, self.detail = interval, watchdog_budget, detail
        self.cgroup, self.stall_limit, self.on_sample, self.on_event = cgroup, stall, on_sample, on_event
        self.wake = wake
        self.seen: dict = {}  # pid -> {"create_time", "name", "ppid", "peak_rss", "peak_uss", "role", ...}
        self.samples: list = []
        self.kills: list = []
        self.events: list = []
        self.stalled: Optional[dict] = None
        self.callback_errors: list = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self._reported_batches = 0  # the batch count the last main-process sample carried
        self._loader = _Tail(os.path.join(run_dir, "loader.jsonl"))
        self._procs_log = _Tail(os.path.join(run_dir, "procs.jsonl"))
        self._exits = _Tail(os.path.join(run_dir, "exits.jsonl"))
        self.exit_codes: dict = {}  # pid -> exit code as the main process reaped it
        self._pending: dict = {}
        self.worker_pids: set = set()
        self.iters: dict = {}  # iterator id -> {"created": t, "batches": n, "last": t}
        self._alive: set = set()
        self._oom_count = 0
        self._oom_attributed = 0
        self.kernel_oom_pids: list = []

    # ------------------------------------------------------------------ evidence from the run's files
    def _read_logs(self) -> None:
        for rec in self._exits.read():
            if isinstance(rec.get("pid"), int) and isinstance(rec.get("exitcode"), int):
                self.exit_codes[rec["pid"]] = rec["exitcode"]
        for rec in self._procs_log.read():
            if str(rec.get("target", "")).endswith("_worker_loop"):
                self.worker_pids.add(rec.get("pid"))
            if rec.get("pid") is not None:
                self.procs.adopt(rec["pid"], rec.get("start_ticks"), why="started by the run's main process")
        for rec in self._loader.read():
            event, it = rec.get("event"), rec.get("iter")
            if event == "iter" and it is not None:
                self.iters[it] = {"created": rec.get("t", time.time()), "batches": 0, "last": None}
            elif event == "progress" and it in self.iters:
                entry = self.iters[it]
                if rec.get("batches", 0) > entry["batches"]:
                    entry["batches"], entry["last"] = rec["batches"], rec.get("t")

    @property
    def batches(self) -> int:
        return sum(e["batches"] for e in self.iters.values())

    def _role(self, pid: int, name: str) -> str:
        if pid == self.pid:
            return "main"
        if pid in self.worker_pids or name == "pt_data_worker":
            return "worker"
        return "other"

    # ------------------------------------------------------------------ one tick
    def _tick(self, psutil) -> bool:
        tree = _descendants(self.pid, psutil)
        for pid in tree[1:]:
            self.procs.adopt(pid)
        self._read_logs()
        self._flush_pending()
        now = round(time.monotonic() - self.t0, 3)
        wall = time.time()
        if self.cgroup is not None and self.cgroup.directory is None:
            self.cgroup.locate(self.pid)  # a systemd scope: its directory once systemd-run has moved us in
        if self.cgroup is not None:
            count = self.cgroup.oom_kills()
            if count is not None:
                self._oom_count = count
        need_full = self.budget is not None or self.detail or self.on_sample is not None
        alive_now, charged, rows = set(), 0, []
        for proc in list(self.procs.known.values()):
            pid = proc.pid
            if pid in self._alive and not self.procs.alive(proc):
                self._died(proc, wall)
                continue
            if not self.procs.alive(proc):
                continue
            alive_now.add(pid)
            rss = _rss(pid)
            if not rss:  # gone, or exiting (its memory is already released)
                continue
            info = self.seen.get(pid)
            if info is None:
                info = self.seen[pid] = {
                    "create_time": None, "ppid": proc.ppid, "name": proc.name, "peak_rss": 0,
                    "peak_uss": None, "first_seen": now, "role": self._role(pid, proc.name),
                    "start_ticks": proc.ticks}
            info["role"] = self._role(pid, proc.name)
            info["peak_rss"] = max(info["peak_rss"], rss)
            info["last_seen"] = now
            roll = _rollup(pid) if need_full else None
            if roll is not None:
                charged += roll["Pss"] if not any(k["pid"] == pid for k in self.kills) else 0
                if self.detail or self.on_sample is not None:
                    info["peak_uss"] = max(info["peak_uss"] or 0, roll["Uss"])
                if self.detail:
                    self.samples.append({"t": now, "pid": pid, "rss": rss, "uss": roll["Uss"],
                                         "pss": roll["Pss"]})
            rows.append((proc, info, rss, roll))
        self._alive = alive_now
        if self.budget is not None and charged > self.budget:
            self._watchdog_kill(rows, charged, now)
        if self.on_sample is not None:
            for proc, info, rss, roll in rows:
                self._call(self.on_sample, {
                    "t": now, "pid": proc.pid, "role": info["role"], "name": proc.name, "rss": rss,
                    "uss": roll["Uss"] if roll else None, "fds": _num_fds(proc.pid),
                    "shm_bytes": _status_kb(proc.pid, b"RssShmem:"),
                    "batches": self.batches if info["role"] == "main" else None})
                if info["role"] == "main":
                    self._reported_batches = self.batches
        if self.stall_limit is not None and self.stalled is None:
            self._check_stall(wall, alive_now)
        return bool(tree)

    def _watchdog_kill(self, rows: list, charged: int, now: float) -> None:
        candidates = [r for r in rows if not any(k["pid"] == r[0].pid for k in self.kills)]
        if not candidates:
            return
        # the kernel's choice: the highest oom_score (its badness: mostly RSS), largest RSS on a tie
        proc, info, rss, roll = max(candidates, key=lambda r: (_oom_score(r[0].pid), r[2]))
        if self.procs.send(proc, signal.SIGKILL):
            self.kills.append({"pid": proc.pid, "rss": rss, "budget": self.budget, "t": now,
                               "main": proc.pid == self.pid, "charged": charged,
                               "pss": roll["Pss"] if roll else None, "basis": "summed PSS of the run"})

    def _died(self, proc, wall: float) -> None:
        exitcode, sig = _decode_status(_procs.zombie_status(proc.pid))
        if exitcode is None and sig is None:
            if proc.pid not in self.exit_codes:  # reaped already: the main process's record may follow
                self._pending[proc.pid] = (proc, wall, time.monotonic() + 1.0)
                return
            code = self.exit_codes[proc.pid]
            exitcode, sig = (None, -code) if code < 0 else (code, None)
        self._emit(proc, wall, exitcode, sig)

    def _flush_pending(self, force: bool = False) -> None:
        for pid, (proc, wall, deadline) in list(self._pending.items()):
            if pid in self.exit_codes or force or time.monotonic() > deadline:
                del self._pending[pid]
                code = self.exit_codes.get(pid)
                exitcode, sig = (None, None) if code is None else ((None, -code) if code < 0 else (code, None))
                self._emit(proc, wall, exitcode, sig)

    def _emit(self, proc, wall: float, exitcode, sig) -> None:
        by = None
        if any(k["pid"] == proc.pid for k in self.kills):
            by = "watchdog"
        elif self.cgroup is not None and sig in (9, None) and self._oom_count > self._oom_attributed:
            self._oom_attributed += 1
            self.kernel_oom_pids.append(proc.pid)
            by = "kernel_oom"
        info = self.seen.get(proc.pid, {})
        event = {"t": wall, "pid": proc.pid, "role": info.get("role", self._role(proc.pid, proc.name)),
                 "name": proc.name, "exitcode": exitcode, "signal": sig, "by": by}
        self.events.append(event)
        if self.on_event is not None:
            self._call(self.on_event, dict(event))

    def _check_stall(self, wall: float, alive_now: set) -> None:
        if not self.iters:
            return
        if not any(self._role(pid, self.procs.known[pid].name) == "worker" for pid in alive_now
                   if pid in self.procs.known):
            return
        last = max((e["last"] or e["created"]) for e in self.iters.values())
        idle = wall - last
        if idle >= self.stall_limit:
            self.stalled = {"limit": self.stall_limit, "batches": self.batches, "idle_s": round(idle, 2)}
            if self.wake is not None:
                self.wake()

    def _call(self, fn, arg) -> None:
        try:
            fn(arg)
        except Exception as exc:  # noqa: BLE001 - a broken listener must not stop the watch
            if len(self.callback_errors) < 5:
                self.callback_errors.append(repr(exc))

    def run(self) -> None:
        psutil = _psutil()
        interval = self.interval if self.on_sample is None else min(self.interval, 0.25)
        while not self.stop.is_set():
            self._tick(psutil)
            self.stop.wait(interval)

    def finish(self) -> None:
        """A last look after the main process ended (deaths, logs), from the caller's thread."""
        self.stop.set()
        self.join(timeout=5)
        self._read_logs()
        if self.cgroup is not None:
            count = self.cgroup.oom_kills()
            if count is not None:
                self._oom_count = count
        wall = time.time()
        for pid in list(self._alive):
            proc = self.procs.known.get(pid)
            if proc is not None and not self.procs.alive(proc):
                self._died(proc, wall)
        self._alive = set()
        self._flush_pending(force=True)
        if self.on_sample is not None and self.batches > self._reported_batches:
            # batches that came after the main process's last sample (often the last of them): one more
            # point for the live chart, with no memory figures (the process is gone)
            self._reported_batches = self.batches
            self._call(self.on_sample, {
                "t": round(time.monotonic() - self.t0, 3), "pid": self.pid, "role": "main", "name": None,
                "rss": None, "uss": None, "fds": None, "shm_bytes": None, "batches": self.batches, "final": True})


def _dump_stacks(procs, run_dir: str, wait: float = 0.6) -> dict:
    """SIGUSR1 to every live process of the run that registered a stack dump; return ``{pid: text}``."""
    folder = os.path.join(run_dir, "stacks")
    if not hasattr(signal, "SIGUSR1") or not os.path.isdir(folder):
        return {}
    sent = []
    for proc in procs.living():
        path = os.path.join(folder, f"{proc.pid}.txt")
        if os.path.exists(path) and procs.send(proc, signal.SIGUSR1):
            sent.append((proc.pid, path))
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not all(os.path.getsize(p) for _, p in sent):
        time.sleep(0.02)
    time.sleep(0.05)  # let a dump that has started finish
    return {pid: text for pid, path in sent if (text := _read_text(path))}


# --------------------------------------------------------------------------- files of the run
def _shm_entries() -> set:
    try:
        return set(os.listdir(_SHM))
    except OSError:
        return set()


def _owned_shm(before: set, run_dir: str, procs_by_pid: Mapping[int, int]) -> list:
    """Names of /dev/shm files this run created and that still exist.

    * ``sem.mp-*``: recorded as created by a process of the run (``created_shm.jsonl``), same inode;
    * ``torch_<pid>_*``: not there when the run began, ``<pid>`` is a verified process of the run, and the
      file was last changed after that process started (so not by an earlier holder of the number).
    ``procs_by_pid`` maps each verified pid to its start time in clock ticks.
    """
    owned = []
    recorded = {}
    for rec in _read_jsonl(os.path.join(run_dir, "created_shm.jsonl")):
        if isinstance(rec.get("name"), str):
            recorded[rec["name"]] = rec.get("ino")
    now = _shm_entries()
    for name in now - before:
        path = os.path.join(_SHM, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if name in recorded:
            if recorded[name] is None or recorded[name] == st.st_ino:
                owned.append(name)
        elif name.startswith("torch_"):
            parts = name.split("_")
            if len(parts) > 2 and parts[1].isdigit() and int(parts[1]) in procs_by_pid:
                ticks = procs_by_pid[int(parts[1])]
                if ticks is not None and min(st.st_ctime, st.st_mtime) >= _procs.start_wall(ticks) - 0.02:
                    owned.append(name)
    return sorted(owned)


def _remove_files(names: Sequence[str]) -> tuple:
    removed, left = [], []
    for name in names:
        try:
            os.unlink(os.path.join(_SHM, name))
            removed.append(name)
        except FileNotFoundError:
            pass
        except OSError:
            left.append(name)
    return removed, left


LEDGER_ENV = "LABUTILS_SHM_LEDGER"


def _ledger(created: list, leftover: list, ticks: Mapping) -> None:
    """Append what this run created in /dev/shm, and its pids, to the file named by ``LABUTILS_SHM_LEDGER``
    (set by a test harness, inherited by every process below it): leak checks by identity, not by a diff of
    a /dev/shm that neighbours share."""
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    record = {"created": list(created), "leftover": list(leftover), "pids": sorted(p for p in ticks if p)}
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
    except OSError:
        pass


def find_strays() -> list:
    """Pids of processes left over from finished isolated runs (their run directory is gone).

    Every process of a cold run, workers included, carries ``LABUTILS_RUN_DIR`` in its environment; the
    directory is deleted when the run is over, so a live process that still names a missing directory
    has outlived its run. A warm run's processes are found by the session of its main process. Expected
    result: ``[]``.
    """
    psutil = _psutil()
    strays = []
    sessions = {}
    for sid, ticks, ended in _warm.finished_sessions:
        sessions.setdefault(sid, []).append((ticks, ended))
    for proc in psutil.process_iter(["pid"]):
        try:
            run_dir = proc.environ().get("LABUTILS_RUN_DIR")
            if run_dir and not os.path.isdir(run_dir) and proc.status() != psutil.STATUS_ZOMBIE:
                strays.append(proc.pid)
            elif sessions:
                # a warm run's processes were forked, not executed: their /proc environ is the template's.
                # They are known by the session of the run's main process, and by having started while it ran.
                fields = _procs.stat_fields(proc.pid)
                if not fields or int(fields[3]) not in sessions or fields[0] == b"Z":
                    continue
                wall = _procs.start_wall(int(fields[19]))
                if any(ticks is not None and _procs.start_wall(ticks) - 0.02 <= wall <= ended
                       for ticks, ended in sessions[int(fields[3])]):
                    strays.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError, ValueError, IndexError):
            continue
    return strays


def leftover_shm() -> list:
    """``/dev/shm`` entries named like PyTorch segments (``torch_*``) or multiprocessing semaphores."""
    return sorted(n for n in _shm_entries() if n.startswith(("torch_", "sem.mp-")))


# --------------------------------------------------------------------------- the runner
Target = Union[str, os.PathLike]


def _resolve_func(func: Union[Callable, str]) -> tuple:
    if isinstance(func, str):
        module, sep, qualname = func.partition(":")
        if not sep or not module or not qualname:
            raise IsolationError(f"func={func!r}: give a callable or a 'module:function' string")
        return module, qualname, None
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise IsolationError(f"func={func!r} is not a module-level function; define it at the top of a "
                             "module (e.g. with %%writefile) so a fresh process can import it")
    if module == "__main__":
        raise IsolationError(f"func={qualname} is defined in __main__ (this notebook), which a fresh process "
                             "cannot import; pass the code as a cell (%%isolate) or put it in a module file")
    path = None
    try:
        path = inspect.getsourcefile(func)
    except TypeError:
        pass
    return module, qualname, path


def _bad(argument: str, value: Any, problem: str) -> IsolationError:
    return IsolationError(f"{argument}={value!r}: {problem}", argument=argument, value=value, problem=problem)


def _size_arg(argument: str, value: Any) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        problem = str(exc)
        prefix = f"invalid size {value!r}: "
        raise _bad(argument, value, problem[len(prefix):] if problem.startswith(prefix) else problem) from None


_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


def _cell_bytes(code: str) -> bytes:
    """The cell's text as the bytes of a module file: in the encoding its coding cookie declares, if any."""
    for line in code.splitlines()[:2]:
        m = _COOKIE.match(line.encode("utf-8", "replace"))
        if m:
            encoding = m.group(1).decode("ascii")
            try:
                return code.encode(encoding)
            except LookupError:
                raise _bad("code", f"coding: {encoding}", "unknown encoding in the coding cookie") from None
            except UnicodeEncodeError as exc:
                raise _bad("code", f"coding: {encoding}", f"the cell has characters {encoding} cannot "
                           f"hold ({exc.reason}); remove the cookie or use utf-8") from None
        if line.strip() and not line.lstrip().startswith("#"):
            break
    return code.encode("utf-8")


def _enforcement(value: Optional[str]) -> str:
    chosen = value if value is not None else (os.environ.get(MEMORY_ENFORCEMENT_ENV, "").strip() or "auto")
    if chosen not in MEMORY_ENFORCEMENTS:
        argument = "memory_enforcement" if value is not None else MEMORY_ENFORCEMENT_ENV
        raise _bad(argument, chosen, f"use one of {', '.join(MEMORY_ENFORCEMENTS)}")
    return chosen


def run_isolated(
    code: Optional[str] = None,
    *,
    file: Optional[Target] = None,
    func: Union[Callable, str, None] = None,
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    argv: Sequence[str] = (),
    start_method: Optional[str] = None,
    timeout: Optional[float] = 60.0,
    memory_budget: Union[int, str, None] = None,
    shm_size: Union[int, str, None] = None,
    nofile: Optional[int] = None,
    env: Optional[Mapping[str, str]] = None,
    notebook_main: bool = False,
    max_processes: Optional[int] = None,
    cwd: Optional[Target] = None,
    sample_interval: float = 0.05,
    memory_detail: bool = False,
    python: Optional[str] = None,
    memory_enforcement: Optional[str] = None,
    stall: Optional[float] = None,
    on_sample: Optional[Callable[[dict], Any]] = None,
    on_event: Optional[Callable[[dict], Any]] = None,
    launcher: Optional[str] = None,
) -> RunResult:
    """Run learner code in a fresh Python process and return what happened as a :class:`RunResult`.

    Give exactly one of ``code`` (the text of a cell; it is written to a real module file and run like
    ``python lab_cell.py``), ``file`` (a script, run unchanged with ``argv``) or ``func`` (a module-level
    callable or ``"module:function"``, called with ``args``/``kwargs``; its JSON-able return value is kept).

    Limits, each enforced for this run only:

    * ``start_method``: ``"fork"``, ``"spawn"`` or ``"forkserver"`` (multiprocessing default if None);
    * ``timeout``: seconds before every process of the run is SIGKILLed (outcome ``timed_out``); a
      Python stack dump of the main process and each DataLoader worker is taken first
      (``result.stacks``). ``None`` waits forever (not advised);
    * ``stall``: seconds without a delivered batch, while a DataLoader worker is alive, before the run is
      stopped the same way (``result.stall`` says how many batches came and how long it was idle);
    * ``memory_budget``: bytes or "600M" (at least 64 MiB) for the whole run. Where the OS lets the lab make
      a memory-limited cgroup for the run, the kernel enforces it and its OOM killer picks the victim;
      elsewhere the lab's watchdog SIGKILLs the largest process of the run when the run's summed PSS
      (shared pages counted once, as the kernel charges them) exceeds it. ``result.memory_limit`` says
      which; ``memory_enforcement`` (or ``LABUTILS_MEMORY_ENFORCEMENT``) forces ``"kernel"`` (the
      outcome is ``unsupported`` where impossible) or ``"watchdog"``; ``"auto"`` is the default;
    * ``shm_size``: the run sees a private tmpfs of that size on /dev/shm (Linux mount namespace); where the
      OS refuses, the outcome is ``unsupported`` with the reason, and nothing runs;
    * ``nofile``: soft RLIMIT_NOFILE inside the run (at most the hard limit); ``env``: extra environment
      variables;
    * ``max_processes``: at most that many tasks (processes and threads, as the kernel counts them) in the
      run at once, so a fork beyond it is refused (``BlockingIOError: [Errno 11]``): a child pids cgroup
      (``pids.max``) where the lab may make one, else RLIMIT_NPROC (not for root); else ``unsupported``;
    * ``notebook_main``: run ``code`` (or the file's text) in a ``__main__`` without ``__file__``, as in a
      notebook or ``python -c``: spawn/forkserver children cannot import classes defined there.

    ``launcher``: ``"auto"`` (default, or ``LABUTILS_LAUNCHER``) starts the run from a warm template that
    has imported torch already (``labutils.runner.warm``) where that is the same as a fresh process, else cold;
    ``"cold"`` always starts a fresh interpreter; ``"warm"`` refuses runs that cannot start warm.
    ``result.launcher`` says which was used and why a run started cold.

    ``memory_detail=True`` also samples USS/PSS of every process each ``sample_interval`` seconds into
    ``result.samples`` (costlier; for the memory lessons). For a live view, ``on_sample(dict)`` is called
    from the monitor thread for every process at least four times a second with ``t``, ``pid``, ``role``
    (main / worker / other), ``name``, ``rss``, ``uss``, ``fds``, ``shm_bytes`` and ``batches`` (and once
    more after the run, ``final=True`` with the main process's last batch count and no memory figures, when
    batches came after its last sample), and ``on_event(dict)`` for each process death seen (``exitcode``
    or ``signal``, and ``by``: watchdog, kernel_oom or None).

    Only the run's own processes are ever signalled and only /dev/shm files the run created are removed.
    """
    given = [x is not None for x in (code, file, func)]
    if sum(given) != 1:
        raise IsolationError("give exactly one of code=, file= or func=")
    if start_method is not None and start_method not in START_METHODS:
        raise _bad("start_method", start_method, f"use one of {', '.join(START_METHODS)}")
    if start_method is not None and start_method != "spawn" and sys.platform == "win32":
        raise IsolationError("only 'spawn' exists on Windows; run the lab under WSL for fork/forkserver")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0):
        raise _bad("timeout", timeout, "give a positive number of seconds (or None)")
    if stall is not None and (isinstance(stall, bool) or not isinstance(stall, (int, float)) or not stall > 0):
        raise _bad("stall", stall, "give a positive number of seconds (or None)")
    budget = _size_arg("memory_budget", memory_budget) if memory_budget is not None else None
    if budget is not None and budget < MIN_MEMORY_BUDGET:
        raise _bad("memory_budget", memory_budget,
                   f"is {format_size(budget)}, below the lab's floor of {format_size(MIN_MEMORY_BUDGET)}: a Python "
                   "process with torch needs more than that before your code runs, so the run would be "
                   "killed at start-up; give e.g. '600M'")
    enforcement = _enforcement(memory_enforcement)
    shm = _size_arg("shm_size", shm_size) if shm_size is not None else None
    if shm is not None and shm < 64 * 1024:
        raise _bad("shm_size", shm_size, "is below 64 KiB; give e.g. '8M'")
    if nofile is not None:
        if isinstance(nofile, bool) or not isinstance(nofile, int) or nofile < 16:
            raise _bad("nofile", nofile, "give an integer of at least 16 (Python needs a few fds)")
        hard = _hard_nofile()
        if hard is not None and nofile > hard:
            raise _bad("nofile", nofile, f"is above this machine's hard limit of {hard} open files "
                       f"(`ulimit -Hn`); give at most {hard}")
    if max_processes is not None and (isinstance(max_processes, bool) or not isinstance(max_processes, int)
                                      or max_processes < _pids.MIN_MAX_PROCESSES):
        raise _bad("max_processes", max_processes,
                   f"give an integer of at least {_pids.MIN_MAX_PROCESSES} (the run's main process and its threads)")
    if notebook_main and func is not None:
        raise IsolationError("notebook_main=True needs code= or file=, not func=")
    for name, fn in (("on_sample", on_sample), ("on_event", on_event)):
        if fn is not None and not callable(fn):
            raise _bad(name, fn, "give a function that takes one dict")

    try:
        lab_default = _startmethod.requested()
        launcher = _warm.launcher_setting(launcher)
    except ValueError as exc:
        raise IsolationError(str(exc)) from None
    options = {"start_method": start_method, "lab_default_start_method": lab_default,
               "timeout": timeout, "memory_budget": budget, "shm_size": shm,
               "nofile": nofile, "notebook_main": notebook_main, "env": dict(env or {}),
               "memory_enforcement": enforcement, "stall": stall, "launcher": launcher}
    if max_processes is not None:
        options["max_processes"] = max_processes

    prefix: list = []
    if shm is not None:
        prefix, reason = private_shm_support()
        if prefix is None:
            return RunResult(outcome="unsupported", reason=f"shm_size={format_size(shm)}: {reason}",
                             options=options)

    run_dir = tempfile.mkdtemp(prefix="labutils-run-")
    cgroup = pids_group = None
    try:
        cfg: dict = {"start_method": start_method, "nofile": nofile}
        if code is not None:
            path = os.path.join(run_dir, "lab_cell.py")
            with open(path, "wb") as fh:
                fh.write(_cell_bytes(code))
            cfg.update(mode="notebook_main" if notebook_main else "file", path=path, argv=list(argv))
        elif file is not None:
            path = os.path.abspath(os.fspath(file))
            if not os.path.isfile(path):
                raise _bad("file", os.fspath(file), "does not exist; check the path")
            cfg.update(mode="notebook_main" if notebook_main else "file", path=path, argv=list(argv))
        else:
            module, qualname, src = _resolve_func(func)
            cfg.update(mode="func", module=module, qualname=qualname, args=list(args),
                       kwargs=dict(kwargs or {}), argv=list(argv), sys_path0=os.getcwd())
            try:
                json.dumps([cfg["args"], cfg["kwargs"]])
            except TypeError as exc:
                raise IsolationError(f"args/kwargs must be JSON values (numbers, strings, lists): {exc}") from None

        memory_limit = None
        if budget is not None:
            reason = "memory_enforcement='watchdog' was asked for"
            if enforcement != "watchdog":
                cgroup, reason = _cgroup.prepare(budget)
            if cgroup is not None:
                memory_limit = {"enforced_by": "kernel", "limit": budget, "mechanism": cgroup.mechanism,
                                "kernel_record": None}
                cfg["cgroup_procs"] = cgroup.procs_file
            elif enforcement == "kernel":
                return RunResult(outcome="unsupported", options=options,
                                 reason=f"memory_budget={format_size(budget)} with memory_enforcement='kernel': "
                                        f"the kernel cannot enforce it here ({reason}); use 'auto' for the "
                                        "lab's watchdog")
            else:
                memory_limit = {"enforced_by": "watchdog", "limit": budget, "mechanism": _WATCHDOG_MECHANISM,
                                "kernel_record": None, "why_not_kernel": reason}
        if max_processes is not None:
            plan, reason = _pids.prepare(max_processes)
            if plan is None or (plan["group"] is not None and cgroup is not None and cgroup.version == 2):
                reason = reason or "with memory_budget on cgroup v2 the run would need one group for both"
                return RunResult(outcome="unsupported", options=options,
                                 reason=f"max_processes={max_processes}: no way to limit the run's processes "
                                        f"here ({reason}); run it as a user other than root (RLIMIT_NPROC), or "
                                        "where the lab may create a child cgroup")
            pids_group = plan["group"]
            cfg.update(pids_procs=pids_group.procs_file if pids_group else None, nproc=plan["nproc"])
            options["process_limit"] = {"limit": max_processes, "mechanism": plan["mechanism"], "refused": None}
        os.mkdir(os.path.join(run_dir, "py"))
        shutil.copyfile(_CHILD, os.path.join(run_dir, "py", "_labutils_child.py"))
        with open(os.path.join(run_dir, "config.json"), "w", encoding="utf-8") as fh:
            json.dump(cfg, fh)
        result = _execute(run_dir, cfg, options, prefix, shm, budget, timeout, env, cwd, sample_interval,
                          memory_detail, python or sys.executable, cgroup, memory_limit, stall, on_sample,
                          on_event)
        if pids_group is not None:  # the kernel's count of refused forks, read before the group goes
            result.options["process_limit"]["refused"] = (_pids.current(pids_group) or {}).get("refused")
        return result
    finally:
        if cgroup is not None:
            cgroup.remove()
        if pids_group is not None:
            pids_group.remove()
        shutil.rmtree(run_dir, ignore_errors=True)


_WATCHDOG_MECHANISM = ("the lab's watchdog: every 50 ms it sums the PSS of the run's processes (a shared "
                       "page counted once, as the kernel charges it) and, over the limit, SIGKILLs the "
                       "process the kernel would pick (highest oom_score)")


def _hard_nofile() -> Optional[int]:
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return None if hard == resource.RLIM_INFINITY else hard


def _wait_leader(proc, pidfd, wake_r, deadline, monitor) -> str:
    """Wait without reaping: "exited", "stalled" or "timeout"."""
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return "timeout"
        if pidfd is not None:
            ready, _, _ = select.select([pidfd, wake_r], [], [], remaining)
            if pidfd in ready:
                return "exited"
            if wake_r in ready:
                os.read(wake_r, 64)
        else:
            step = 0.02 if remaining is None else min(0.02, remaining)
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return "exited"
            time.sleep(step)
        if monitor.stalled is not None:
            return "stalled"


def _close_fds(*fds) -> None:
    for fd in fds:
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def _execute(run_dir, cfg, options, prefix, shm, budget, timeout, env, cwd, interval, detail, python,
             cgroup, memory_limit, stall, on_sample, on_event):
    cmd = [python, _BOOTSTRAP, run_dir]
    if prefix:
        mount = f"mount -t tmpfs -o size={shm},mode=1777 tmpfs {_SHM} && exec \"$@\""
        cmd = [*prefix, "sh", "-c", mount, "sh", *cmd]
    if cgroup is not None and cgroup.prefix:
        cmd = [*cgroup.prefix, *cmd]
    child_env = dict(os.environ)
    child_env.update({str(k): str(v) for k, v in (env or {}).items()})
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    child_env["LABUTILS_RUN_DIR"] = run_dir
    out_path, err_path = os.path.join(run_dir, "stdout.txt"), os.path.join(run_dir, "stderr.txt")
    shm_before = _shm_entries()
    kmsg = _cgroup.kernel_log_reader() if cgroup is not None else None
    wake_r, wake_w = os.pipe()
    t0 = time.monotonic()
    setting = options.get("launcher", "auto")
    why_cold = _warm.refusal(setting, env=env, prefix=[*prefix, *(cgroup.prefix if cgroup is not None and
                             cgroup.prefix else [])], budget=budget, detail=detail, python=python,
                             process_limit="process_limit" in options)
    if setting == "warm" and why_cold is not None:
        raise IsolationError(f"launcher='warm' is not possible for this run: {why_cold}; use 'auto'")
    proc = None
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        if why_cold is None:
            try:
                proc = _warm.spawn(child_env, run_dir, os.fspath(cwd) if cwd else None, out, err)
            except OSError as exc:
                if setting == "warm":
                    raise IsolationError(f"the warm launcher failed: {exc}; use launcher='auto'") from None
                why_cold = f"the warm template failed ({exc}), so this run started cold"
        if proc is None:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=child_env,
                                    cwd=os.fspath(cwd) if cwd else None, start_new_session=True)
    launcher = {"kind": "cold" if why_cold else "warm", "why_cold": why_cold}
    pidfd = None
    if isinstance(proc, _warm.WarmProcess):
        pidfd = proc.pidfd  # from the template, which reaps the process only when told to
    elif _procs._HAS_PIDFD:
        try:
            pidfd = os.pidfd_open(proc.pid)  # our child, not reaped: certainly this process
        except OSError:
            pidfd = None
    procs = _procs.RunProcesses(run_dir, proc.pid, cgroup=cgroup if cgroup and cgroup.kind == "child" else None)
    monitor = _Monitor(procs, run_dir, interval, budget if memory_limit and memory_limit["enforced_by"] ==
                       "watchdog" else None, detail, cgroup=cgroup, stall=stall, on_sample=on_sample,
                       on_event=on_event, wake=lambda: os.write(wake_w, b"x"))
    monitor.start()
    how = "exited"
    stacks: dict = {}
    try:
        deadline = None if timeout is None else t0 + timeout
        how = _wait_leader(proc, pidfd, wake_r, deadline, monitor)
        if how != "exited":
            stacks = _dump_stacks(procs, run_dir)
    except BaseException:  # KeyboardInterrupt in the kernel: still leave nothing behind
        monitor.stop.set()
        monitor.join(timeout=5)
        procs.terminate(leader_alive=True, helper_grace=0.5)
        proc.wait()
        procs.close()
        _close_fds(wake_r, wake_w, pidfd)
        raise
    finally:
        wall = time.monotonic() - t0
    monitor.finish()
    _close_fds(wake_r, wake_w, pidfd)  # only now: the monitor may write to wake_w until it stops
    kernel_record = cgroup.record() if cgroup is not None else None
    left = procs.terminate(leader_alive=how != "exited")
    proc.wait()  # reaped only now: until here the group id could not be anybody else's
    if cgroup is not None:
        kernel_record = cgroup.record() or kernel_record
    ticks = {p.pid: p.ticks for p in procs.known.values()}
    procs_log = _read_jsonl(os.path.join(run_dir, "procs.jsonl"))
    for rec in procs_log:
        ticks.setdefault(rec.get("pid"), rec.get("start_ticks"))
    procs.close()
    removed, leftover, created = [], [], []
    if not shm:
        owned = _owned_shm(shm_before, run_dir, ticks)
        removed, leftover = _remove_files(owned)
        created = sorted({*owned, *(r["name"] for r in _read_jsonl(os.path.join(run_dir, "created_shm.jsonl"))
                                    if isinstance(r.get("name"), str))})
    _ledger(created, leftover, ticks)
    kernel_lines = _cgroup.read_kernel_log(kmsg)

    final = _read_json(os.path.join(run_dir, "final.json")) or {}
    exits = {p["pid"]: p.get("exitcode") for p in final.get("processes", [])}
    rc = proc.returncode
    event_status = {e["pid"]: e for e in monitor.events}
    killed_by_kernel = set()
    if memory_limit is not None and memory_limit["enforced_by"] == "kernel":
        memory_limit["kernel_record"] = _kernel_record(kernel_record, kernel_lines, cgroup, ticks, monitor,
                                                       exits, rc, proc.pid, how)
        killed_by_kernel = set(memory_limit["kernel_record"]["killed_pids"])
    workers = []
    for rec in procs_log:
        pid = rec["pid"]
        info = monitor.seen.get(pid, {})
        kill = next((k for k in monitor.kills if k["pid"] == pid), None)
        exitcode = exits.get(pid)
        if exitcode is None:
            exitcode = monitor.exit_codes.get(pid)
        if exitcode is None and pid in event_status:
            ev = event_status[pid]
            exitcode = -ev["signal"] if ev.get("signal") else ev.get("exitcode")
        if exitcode is None and (pid in killed_by_kernel or kill is not None):
            exitcode = -9  # its parent died before reaping it; the kernel (or the watchdog) sent SIGKILL
        workers.append(ProcessInfo(
            pid=pid, name=rec.get("name", ""), role="dataloader_worker"
            if rec.get("target", "").endswith("_worker_loop") else "process",
            exitcode=exitcode, peak_rss=info.get("peak_rss"), peak_uss=info.get("peak_uss"),
            killed_by_watchdog=kill is not None, killed_by_kernel_oom=pid in killed_by_kernel))
    exc_chain = [ExceptionInfo(**e) for e in (_read_json(os.path.join(run_dir, "exc.json")) or [])]
    loader_log = _read_jsonl(os.path.join(run_dir, "loader.jsonl"))
    stderr = _read_text(err_path)
    main_stack = stacks.get(proc.pid)
    if main_stack:
        stderr += (f"\n--- labutils: Python stack of the main process (pid {proc.pid}) before the runner "
                   f"killed the run ---\n{main_stack}")
    if how == "timeout":
        outcome, reason = "timed_out", f"no result within {timeout:g} s; the runner killed every process of the run"
    elif how == "stalled":
        outcome = "timed_out"
        reason = (f"no batch for {monitor.stalled['idle_s']:g} s (stall={stall:g}) while DataLoader workers were "
                  f"alive, after {monitor.stalled['batches']} batches; the runner killed every process of the run")
    else:
        outcome, reason = ("ok" if rc == 0 else "failed"), None
    if rc == 3 and cfg.get("cgroup_procs") and "could not join the run's memory cgroup" in stderr:
        outcome, reason = "unsupported", stderr.strip().splitlines()[-1]
    main_info = monitor.seen.get(proc.pid, {})
    return RunResult(
        outcome=outcome,
        returncode=rc,
        signal=-rc if rc is not None and rc < 0 else None,
        workers=workers,
        exceptions=exc_chain,
        loader_events=loader_log,
        stdout=_read_text(out_path),
        stderr=stderr,
        wall_time=wall,
        peak_rss=main_info.get("peak_rss"),
        watchdog_kills=list(monitor.kills),
        samples=monitor.samples,
        processes_seen=len(procs.known),
        stray_processes=left,
        shm_removed=removed,
        reason=reason,
        options=options,
        value=_read_json(os.path.join(run_dir, "value.json")),
        values=_merge(_read_jsonl(os.path.join(run_dir, "emitted.jsonl"))),
        memory_limit=memory_limit,
        stall=monitor.stalled,
        stacks=stacks,
        events=list(monitor.events),
        leftover_files=leftover,
        shm_created=created,
        launcher=launcher,
    )


_KILLED_LINE = re.compile(r"Killed process (\d+) \(([^)]*)\)")


def _kernel_record(record, lines, cgroup, ticks, monitor, exits, rc, main_pid, how) -> dict:
    """The kernel's counters for the run's group, its log lines about the run, and who it killed."""
    out = dict(record or {})
    out["cgroup"] = cgroup.directory
    name = os.path.basename(cgroup.directory or "") or None
    ours = []
    killed = []
    for line in lines:
        if name and name in line or any(f"pid={p}," in line for p in ticks):
            ours.append(line)
        m = _KILLED_LINE.search(line)
        if m and int(m.group(1)) in ticks:
            if line not in ours:
                ours.append(line)
            killed.append(int(m.group(1)))
    out["dmesg"] = ours if lines else None
    how_known = "dmesg" if killed else None
    if not killed:
        # no readable kernel log: the processes that died by SIGKILL while oom_kill counted
        killed = list(monitor.kernel_oom_pids)
        how_known = "monitor" if killed else None
        if not killed and out.get("oom_kill"):
            sigkilled = [pid for pid, code in exits.items() if code == -9]
            if rc == -9 and how == "exited":
                sigkilled.append(main_pid)
            if len(sigkilled) == out["oom_kill"]:
                killed, how_known = sigkilled, "exit status"
    out["killed_pids"] = sorted(set(killed))
    out["main_killed"] = main_pid in out["killed_pids"]
    out["killed_pids_from"] = how_known
    return out


def _merge(records: list) -> dict:
    out: dict = {}
    for rec in records:
        if isinstance(rec, dict):
            out.update(rec)
    return out


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().replace("\x00", "")
    except OSError:
        return ""


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _read_jsonl(path: str) -> list:
    out = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out
