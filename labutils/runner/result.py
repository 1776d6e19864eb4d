"""The record of one isolated run: what ran, how it ended, and the evidence it left."""

from __future__ import annotations

import html
import signal as _signal
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from .. import _lazy


def signal_name(num: Optional[int]) -> Optional[str]:
    """``9 -> 'SIGKILL'``; None stays None; unknown numbers become ``'signal 42'``."""
    if num is None:
        return None
    try:
        return _signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def describe_exit(code: Optional[int]) -> str:
    """A multiprocessing/Popen exit code in words: negative means killed by that signal."""
    if code is None:
        return "unknown (still running when last seen, or never reported)"
    if code < 0:
        return f"killed by {signal_name(-code)}"
    return "exited normally (0)" if code == 0 else f"exited with code {code}"


@dataclass
class ExceptionInfo:
    """One link of an exception chain: ``link`` says how it hangs on the one before ("cause"/"context")."""

    type: str
    message: str
    module: str = "builtins"
    link: Optional[str] = None
    traceback: str = ""

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"


@dataclass
class ProcessInfo:
    """A process started by the run's main process (DataLoader workers have role 'dataloader_worker')."""

    pid: int
    name: str = ""
    role: str = "process"
    exitcode: Optional[int] = None
    peak_rss: Optional[int] = None
    peak_uss: Optional[int] = None
    killed_by_watchdog: bool = False
    killed_by_kernel_oom: bool = False
    #: still running when the run ended (after its main process, or at its time limit), with no exit status
    #: of its own: the lab stopped it. Under python it would have gone on alone.
    stopped_by_lab: bool = False

    @property
    def signal(self) -> Optional[int]:
        return -self.exitcode if self.exitcode is not None and self.exitcode < 0 else None

    @property
    def status(self) -> str:
        if self.stopped_by_lab:
            return "still running when the run ended; the lab stopped it (SIGKILL)"
        text = describe_exit(self.exitcode)
        if self.killed_by_kernel_oom:
            return text + " (the kernel's OOM killer, in the run's memory cgroup)"
        return text + " (the lab's memory watchdog)" if self.killed_by_watchdog else text


@dataclass
class RunResult:
    """What one isolated run did. ``outcome`` is one of ok / failed / timed_out / unsupported."""

    outcome: str
    returncode: Optional[int] = None
    signal: Optional[int] = None
    workers: list = field(default_factory=list)
    exceptions: list = field(default_factory=list)
    loader_events: list = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    wall_time: float = 0.0
    peak_rss: Optional[int] = None
    watchdog_kills: list = field(default_factory=list)
    samples: list = field(default_factory=list)
    processes_seen: int = 0
    stray_processes: list = field(default_factory=list)
    shm_removed: list = field(default_factory=list)
    reason: Optional[str] = None
    options: dict = field(default_factory=dict)
    value: Any = None
    values: dict = field(default_factory=dict)
    #: None, or {"enforced_by": "kernel"|"watchdog", "limit": bytes, "mechanism": str,
    #: "kernel_record": dict|None}: who enforced memory_budget, and the kernel's own record of the run
    memory_limit: Optional[dict] = None
    #: None, or {"limit": s, "batches": n, "idle_s": s} when the runner stopped a run for a stall
    stall: Optional[dict] = None
    #: {pid: faulthandler text}: Python stacks taken before the runner killed the run (time limit, stall)
    stacks: dict = field(default_factory=dict)
    #: process deaths seen while the run went: {"t", "pid", "role", "name", "exitcode", "signal", "by"}
    events: list = field(default_factory=list)
    #: /dev/shm files this run created that still exist after the clean-up (expected: [])
    leftover_files: list = field(default_factory=list)
    #: /dev/shm names known to be this run's: semaphores recorded as created, segments left at its end
    shm_created: list = field(default_factory=list)
    #: {"kind": "warm"|"cold", "why_cold": str|None, "tracking": how its processes were held (a pidfd each,
    #: or pid plus start time where pidfds do not work)}: whether the run started from the warm template
    launcher: Optional[dict] = None
    #: {"stdout"|"stderr": {"size", "kept", "cut", "cap"}} for output longer than the cap: its first and
    #: last halves are kept, the middle is cut (a line in the text says where); {} when nothing was cut
    truncated: dict = field(default_factory=dict)
    #: errors the monitor met while the run went (it carried on; with a watchdog budget it stopped the run)
    monitor_errors: list = field(default_factory=list)
    #: cgroups made for the run that could not be removed after it (expected: [])
    leftover_cgroups: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def exception(self) -> Optional[ExceptionInfo]:
        """The exception that ended the main process (the outer one), if any."""
        return self.exceptions[0] if self.exceptions else None

    @property
    def dataloader_workers(self) -> list:
        return [w for w in self.workers if w.role == "dataloader_worker"]

    @property
    def loader_errors(self) -> list:
        """Exception chains that escaped a DataLoader iterator (``next()``, or ``iter()`` when a worker died
        while the iterator was still starting its workers), even ones the script caught; in time order."""
        chains = [[ExceptionInfo(**e) for e in ev["chain"]] for ev in self.loader_events
                  if ev.get("event") in ("error", "init_error")]
        if not chains:  # PyTorch's SIGCHLD handler raised between two next() calls, outside the wrappers
            chains = [[ExceptionInfo(**e) for e in ev["chain"]] for ev in self.loader_events
                      if ev.get("event") == "sigchld_error"]
        return chains

    @property
    def all_messages(self) -> str:
        """Every exception message of the run (main chain and loader errors), one per line."""
        lines = [str(e) for e in self.exceptions]
        for chain in self.loader_errors:
            lines.extend(str(e) for e in chain)
        return "\n".join(lines)

    @property
    def diagnosis(self):
        """The cause of what happened, from :func:`labutils.explain` (computed once; the package's face hands
        it down, :func:`labutils._lazy.explain`, since the runner sits below the diagnosis)."""
        cached = self.__dict__.get("_diagnosis")
        if cached is None:
            cached = self.__dict__["_diagnosis"] = _lazy.explain(self)
        return cached

    @property
    def cause(self) -> str:
        return self.diagnosis.cause

    def stderr_tail(self, n: int = 8) -> list:
        """The last ``n`` stderr lines worth reading: multiprocessing's resource_tracker chatter about
        semaphores of killed processes (a warning and its ``warnings.warn`` echo) is left out."""
        lines = self.stderr.strip().splitlines()
        keep = []
        for i, line in enumerate(lines):
            if "resource_tracker" in line:
                continue
            if line.strip().startswith("warnings.warn(") and i and "resource_tracker" in lines[i - 1]:
                continue
            keep.append(line)
        return keep[-n:]

    def stderr_lines(self, contains: str = "") -> list:
        return [ln for ln in self.stderr.splitlines() if contains in ln]

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("samples")
        data["exit"] = self.exit_text
        return data

    @property
    def exit_text(self) -> str:
        if self.outcome == "unsupported":
            return "did not run"
        if self.outcome == "timed_out":
            return "killed by the runner after the time limit"
        return describe_exit(self.returncode)

    @property
    def memory_limit_text(self) -> Optional[str]:
        """One line: who enforced the memory budget, and what the kernel recorded."""
        ml = self.memory_limit
        if not ml:
            return None
        limit = f"{ml['limit'] / 2**20:.0f} MiB"
        if ml.get("enforced_by") == "kernel":
            rec = ml.get("kernel_record") or {}
            text = f"memory limit {limit} enforced by the kernel ({ml.get('mechanism')})"
            if rec.get("oom_kill"):
                who = ", ".join(f"pid {p}" for p in rec.get("killed_pids") or []) or "a process of the run"
                text += f": the kernel's OOM killer killed {who} (oom_kill {rec['oom_kill']})"
            return text
        return f"memory limit {limit} enforced by the lab's watchdog, standing in for the kernel's OOM killer"

    def summary_lines(self) -> list:
        lines = [f"outcome: {self.outcome}   main process: {self.exit_text}   wall: {self.wall_time:.2f} s"]
        if self.reason:
            lines.append(f"reason: {self.reason}")
        if self.memory_limit_text:
            lines.append(self.memory_limit_text)
        for k in self.watchdog_kills:
            who = "main process" if k.get("main") else f"pid {k['pid']}"
            lines.append(f"memory watchdog: SIGKILLed {who} at {k['rss'] / 2**20:.0f} MiB "
                         f"(budget {k['budget'] / 2**20:.0f} MiB"
                         + (f", run charged {k['charged'] / 2**20:.0f} MiB PSS" if k.get("charged") else "")
                         + ") - the lab's stand-in for the OOM killer")
        for w in self.workers:
            mem = f", peak RSS {w.peak_rss / 2**20:.0f} MiB" if w.peak_rss else ""
            lines.append(f"{w.role} pid {w.pid}: {w.status}{mem}")
        for i, e in enumerate(self.exceptions):
            how = {"cause": "caused by", "context": "while handling"}.get(e.link, "raised")
            lines.append(f"{'  ' * i}{how}: {e.type}: {_short(e.message)}")
        return lines

    def __str__(self) -> str:
        """The record in words: how the run ended, each process, the exception chain, the stderr tail. The
        cause is the diagnosis's to say (``labutils.explain``); the lab's card (``labutils.lab.card``) shows both."""
        lines = self.summary_lines()
        tail = self.stderr_tail(8)
        if tail:
            lines.append("stderr (last lines):")
            lines.extend("  " + ln for ln in tail)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"RunResult(outcome={self.outcome!r}, exit={self.exit_text!r}, "
                f"workers={len(self.workers)}, wall_time={self.wall_time:.2f})")

    def _repr_html_(self) -> str:
        """The record as preformatted text; ``%load_ext labutils`` shows the lab's card instead."""
        return f"<pre style='font-size:85%'>{html.escape(str(self))}</pre>"


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
