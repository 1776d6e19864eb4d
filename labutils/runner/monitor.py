"""The monitor of one run: the thread that watches it while it runs, and its stack dumps."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Optional

from . import rundir as _rd
from .procfs import (
    _descendants,
    _num_fds,
    _oom_score,
    _rollup,
    _rss,
    _status_kb,
    split_exitcode,
    start_wall,
    zombie_status,
)
from .spec import StopRun

#: a run whose stdout and stderr together grow past this is stopped (a print loop would fill the shared /tmp)
OUTPUT_LIMIT = 256 * 2**20
#: the same for the evidence records its processes append (``labutils.emit`` in a loop, a DataLoader
#: error recorded on every retry of a catch-and-retry loop): the kernel reads them to a cap, the disk holds all
EVIDENCE_LIMIT = 64 * 2**20
EVIDENCE_FILES = (_rd.LOADER, _rd.EMITTED, _rd.EXITS, _rd.PROCS, _rd.CREATED_SHM, _rd.CREATED_TMP)
#: ticks that may fail in a row before the monitor gives up (and, as the memory enforcer, stops the run)
MAX_TICK_ERRORS = 20


class Monitor(threading.Thread):
    """Watches the run: its processes (verified, with a handle each), memory, progress and deaths; enforces
    the watchdog budget when the kernel does not, detects a stall and calls ``on_sample``/``on_event``.
    PSS/USS are read only for the watchdog, ``memory_detail`` or a listener (a costly read each tick).
    """

    def __init__(self, procs, run_dir: str, spec, cgroup=None, watchdog_budget: Optional[int] = None, wake=None):
        """``spec``: the run's :class:`~labutils.runner.spec.RunSpec` (its ``sample_interval``,
        ``memory_detail``, ``stall``, ``on_sample`` and ``on_event`` are read)."""
        super().__init__(daemon=True, name=f"labutils-monitor-{procs.leader}")
        self.procs, self.pid = procs, procs.leader
        self.interval, self.budget, self.detail = spec.sample_interval, watchdog_budget, spec.memory_detail
        self.cgroup, self.stall_limit = cgroup, spec.stall
        self.on_sample, self.on_event = spec.on_sample, spec.on_event
        self.wake = wake
        self.errors: list = []  # what went wrong in a tick: the watch carried on (see run())
        self.failed_closed = False  # the watchdog could not watch any more, so the run was stopped
        self.stop_requested: Optional[str] = None  # a listener raised StopRun: its message
        self.output_limit, self.evidence_limit = OUTPUT_LIMIT, EVIDENCE_LIMIT
        self.overflow_of: Optional[str] = None  # "output" or the evidence file that grew past its limit
        self._outputs = [os.path.join(run_dir, _rd.STDOUT), os.path.join(run_dir, _rd.STDERR)]
        self._evidence = [os.path.join(run_dir, name) for name in EVIDENCE_FILES]
        self.seen: dict = {}  # pid -> {"peak_rss", "peak_uss", "role"}
        self.samples: list = []
        self.kills: list = []
        self.events: list = []
        self.stalled: Optional[dict] = None
        self.callback_errors: list = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self._reported_batches = 0  # the batch count the last main-process sample carried
        self._loader = _rd.Tail(os.path.join(run_dir, _rd.LOADER))
        self._procs_log = _rd.Tail(os.path.join(run_dir, _rd.PROCS))
        self._exits = _rd.Tail(os.path.join(run_dir, _rd.EXITS))
        self.exit_codes: dict = {}  # pid -> exit code as the main process reaped it
        self._pending: dict = {}
        self.worker_pids: set = set()
        self.iters: dict = {}  # iterator id -> {"created": t, "batches": n, "last": t}
        self._alive: set = set()
        self._oom_count = 0
        self._oom_attributed = 0
        self.kernel_oom_pids: list = []

    def _read_logs(self) -> None:
        for rec in self._exits.read():
            if isinstance(rec.get("pid"), int) and isinstance(rec.get("exitcode"), int):
                self.exit_codes[rec["pid"]] = rec["exitcode"]
        for rec in self._procs_log.read():
            if str(rec.get("target", "")).endswith("_worker_loop"):
                self.worker_pids.add(rec.get("pid"))
            if rec.get("pid") is not None:
                self.procs.adopt(rec["pid"], rec.get("start_ticks"))
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

    def _tick(self) -> None:
        tree = _descendants(self.pid)
        for pid in tree[1:]:
            self.procs.adopt(pid)
        self._read_logs()
        self._flush_pending()
        now = round(time.monotonic() - self.t0, 3)
        wall = time.time()
        if self.cgroup is not None and self.cgroup.directory is None:
            self.cgroup.locate(self.pid)  # a systemd scope: its directory once systemd-run has moved us in
            if self.cgroup.verified and self.cgroup.kind == "systemd":
                self.budget = None  # its memory.max reads the limit: the kernel enforces it from now on
        self._check_output()
        self._count_oom_kills()
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
            info = self.seen.setdefault(pid, {"peak_rss": 0, "peak_uss": None})
            info["role"] = self._role(pid, proc.name)
            info["peak_rss"] = max(info["peak_rss"], rss)
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
        status = zombie_status(proc.pid)  # a zombie's wait status: it exited or a signal ended it
        exitcode, sig = split_exitcode(None if status is None else os.waitstatus_to_exitcode(status))
        if exitcode is None and sig is None:
            if proc.pid not in self.exit_codes:  # reaped already: the main process's record may follow
                self._pending[proc.pid] = (proc, wall, time.monotonic() + 1.0)
                return
            code = self.exit_codes[proc.pid]
            exitcode, sig = split_exitcode(code)
        self._emit(proc, wall, exitcode, sig)

    def _flush_pending(self, force: bool = False) -> None:
        for pid, (proc, wall, deadline) in list(self._pending.items()):
            if pid in self.exit_codes or force or time.monotonic() > deadline:
                del self._pending[pid]
                code = self.exit_codes.get(pid)
                exitcode, sig = split_exitcode(code)
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
        except StopRun as exc:  # the listener has seen what the run was for: end it now
            if self.stop_requested is None:
                self.stop_requested = str(exc) or "a listener raised StopRun"
                if self.wake is not None:
                    self.wake()
        except Exception as exc:  # noqa: BLE001 - a broken listener must not stop the watch
            if len(self.callback_errors) < 5:
                self.callback_errors.append(repr(exc))

    def _check_output(self) -> None:
        if self.overflow_of is not None:
            return
        sizes = {}
        for path in self._outputs + self._evidence:
            try:
                sizes[path] = os.stat(path).st_size
            except OSError:
                sizes[path] = 0
        if sum(sizes[p] for p in self._outputs) > self.output_limit:
            self.overflow_of = "output"
        elif sum(sizes[p] for p in self._evidence) > self.evidence_limit:
            self.overflow_of = os.path.basename(max(self._evidence, key=sizes.__getitem__))
        if self.overflow_of is not None:
            if self.wake is not None:
                self.wake()

    def run(self) -> None:
        """Tick until stopped. A tick that raises is recorded in ``errors`` and the watch goes on; after
        :data:`MAX_TICK_ERRORS` in a row it stops, and where it was the memory enforcer it stops the run
        too (fails closed: a budget nobody watches is no budget)."""
        interval = self.interval if self.on_sample is None else min(self.interval, 0.25)
        in_a_row = 0
        while not self.stop.is_set():
            try:
                self._tick()
                in_a_row = 0
            except Exception as exc:  # noqa: BLE001 - one bad tick must not end the watch
                in_a_row += 1
                if len(self.errors) < 10:
                    self.errors.append(f"tick at {time.monotonic() - self.t0:.2f} s: {exc!r}")
                if in_a_row >= MAX_TICK_ERRORS:
                    self.errors.append(f"the monitor stopped after {in_a_row} failed ticks in a row")
                    if self.budget is not None:
                        self.failed_closed = True
                        if self.wake is not None:
                            self.wake()
                    return
            self.stop.wait(interval)

    def _count_oom_kills(self) -> None:
        """The kernel's OOM kills in the run's memory cgroup so far (its ``memory.events``), where it has one."""
        record = self.cgroup.record() if self.cgroup is not None else None
        if record is not None:
            self._oom_count = record["oom_kill"]

    def finish(self) -> None:
        """A last look after the main process ended (deaths, logs), from the caller's thread."""
        self.stop.set()
        self.join(timeout=5)
        self._read_logs()
        self._count_oom_kills()
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
    """SIGUSR1 to every live process of the run that registered a stack dump; return ``{pid: text}``.

    SIGUSR1's default action ends a process, so the file ``stacks/<pid>.txt`` alone is not enough: it may
    be an earlier process's with the same number (pid reuse within a long run), or the process may have
    exec'd another program since. A process is signalled only if its file was made after it started
    (:func:`_stack_file_is_its`) and it catches SIGUSR1 now (``SigCgt`` in ``/proc/PID/status``)."""
    folder = os.path.join(run_dir, _rd.STACKS)
    if not hasattr(signal, "SIGUSR1") or not os.path.isdir(folder):
        return {}
    sent = []
    for proc in procs.living():
        path = os.path.join(folder, f"{proc.pid}.txt")
        if _stack_file_is_its(path, proc) and _catches(proc.pid, signal.SIGUSR1) \
                and procs.send(proc, signal.SIGUSR1):
            sent.append((proc.pid, path))
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not all(os.path.getsize(p) for _, p in sent):
        time.sleep(0.02)
    time.sleep(0.05)  # let a dump that has started finish
    return {pid: text for pid, path in sent if (text := _rd.read_text(path))}


def _stack_file_is_its(path: str, proc) -> bool:
    """Was ``path`` made (last written) after ``proc`` started? A file older than the process is an
    earlier process's of the same number; the start time has the clock tick's 10 ms resolution."""
    try:
        made = os.stat(path).st_mtime
    except OSError:
        return False
    return proc.ticks is None or made >= start_wall(proc.ticks) - 0.02


def _catches(pid: int, sig: int) -> bool:
    """Does ``pid`` have a handler for ``sig`` now (``SigCgt``)? False after an exec, which resets it."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False

