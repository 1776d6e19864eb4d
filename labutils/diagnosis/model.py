"""The Diagnosis: a cause of the catalogue, its confidence, the evidence, the texts left unexplained, the
fixes; where the failing process sits in the run's process tree; and what the record cannot prove about a
cause, with the one command that decides it on the job's machine.

A log proves what it shows: a SIGKILL, not who sent it; a bus error, not whether /dev/shm was full. A run
proves more (exit statuses, the watchdog, the kernel's record), but not always the sender of a kill."""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field
from typing import Optional

from ..machine import probes
from .causes import LOADER_CAUSES


# =========================================================================== public result type
@dataclass
class Diagnosis:
    """The cause of a run, an exception or a log (``source``: ``run``, ``exception``, ``log``), one of
    :data:`CAUSES` or ``unsupported``/``unknown``, with the evidence used and the fixes. ``confidence`` is
    ``high`` for structured evidence (exit statuses, PyTorch's own messages where it raised them, the watchdog,
    the kernel's OOM record), ``medium`` for a message without its origin, ``low`` for a fallback (a bare hang,
    a SIGKILL with no memory evidence). ``recovered``: the script caught the failure and finished anyway."""

    cause: str
    summary: str
    evidence: list = field(default_factory=list)
    fixes: list = field(default_factory=list)
    confidence: str = "high"
    source: str = "run"
    recovered: bool = False
    #: a multi-process launch (torchrun): the first failed rank, its exit code and pid, every failure
    launch: Optional[dict] = None
    #: the process whose failure decided the cause, when it is not the main process: its role, pid, name,
    #: start method, exit code, parent and how its error reached the record (see :mod:`.tree`)
    process: Optional[dict] = None
    #: every process of the run the record knows of (main first), each with what ended it
    tree: list = field(default_factory=list)
    #: DataLoader error texts in the record that the cause does not explain (then confidence is not high)
    unexplained: list = field(default_factory=list)
    #: what the evidence proves, what it cannot, and the one command that decides it where the job ran
    proves: list = field(default_factory=list)
    cannot_prove: str = ""
    decide_with: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.cause == "ok"

    @property
    def blames_loader(self) -> bool:
        """True when the cause is one of the data-loading causes (not ok, outside_loader or unknown)."""
        return self.cause in LOADER_CAUSES

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        lines = [f"cause: {self.cause} ({self.confidence} confidence)", f"  {self.summary}"]
        for title, items in (("evidence", self.evidence), ("not explained by this cause", self.unexplained),
                             ("what this proves", self.proves)):
            if items:
                lines += [f"{title}:", *(f"  - {x}" for x in items)]
        if self.cannot_prove:
            lines.append(f"what it cannot prove: {self.cannot_prove}")
        if self.decide_with:
            lines.append(f"to decide it, run on the job's machine: {self.decide_with}")
        if self.fixes:
            lines += ["fixes:", *(f"  - {f}" for f in self.fixes)]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        colour = "#1a7f37" if self.cause == "ok" else "#cf222e"
        ev = "".join(f"<li>{esc(e)}</li>" for e in self.evidence)
        fx = "".join(f"<li>{esc(f.text)} <small>(<code>{esc(f.path)}</code>)</small></li>" for f in self.fixes)
        return (f"<div style='border:1px solid #d0d7de;border-radius:6px;padding:6px 10px;margin:4px 0'>"
                f"<div><b>cause: <code style='color:{colour}'>{esc(self.cause)}</code></b> "
                f"<small>({esc(self.confidence)} confidence)</small> &mdash; {esc(self.summary)}</div>"
                + (f"<div>evidence:</div><ul style='margin:2px 0'>{ev}</ul>" if ev else "")
                + (f"<div>cannot prove: {esc(self.cannot_prove)}</div>" if self.cannot_prove else "")
                + (f"<div>to decide it: <code>{esc(self.decide_with)}</code></div>" if self.decide_with else "")
                + (f"<div>fixes:</div><ul style='margin:2px 0'>{fx}</ul>" if fx else "")
                + "</div>")


# =========================================================================== what the record cannot prove
SCRIPT = "python -m labutils diagnose SCRIPT"

#: cause -> (what the text alone cannot prove, the command that decides it on the job's machine)
OPEN: dict = {
    "oom_killed": ("who sent the SIGKILL: the kernel's OOM killer (memory), or a kill -9, a scheduler's "
                   "preemption, timeout -s KILL",
                   "dmesg -T | grep -iE 'killed process|out of memory'  (or the cgroup's memory.events: "
                   "grep oom_kill /sys/fs/cgroup/memory.events)"),
    "shm_exhausted": ("whether /dev/shm was really full: a bus error also comes from a memory-mapped file "
                      "cut short under its reader, and then the cause is native_crash", "df -h /dev/shm"),
    "fd_limit": ("whether the open-files limit was low or the code leaked descriptors", "ulimit -n"),
    "fork_refused": ("which limit refused the process (tasks, memory)",
                     "ulimit -u; cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids.current"),
    "native_crash": ("which native library crashed, and on which sample",
                     "PYTHONFAULTHANDLER=1 " + SCRIPT),
    "worker_exit": ("why the worker exited (its own exit call, a library, a signal the text does not show)",
                    SCRIPT),
    "hang": ("where the processes were stuck", "python -m labutils diagnose --stall 60 SCRIPT  (or py-spy dump "
                                               "--pid PID)"),
}


#: a worker's death named only by the status check's generic line (no exit code, no signal: forkserver and
#: spawn workers are not the main process's children, and the OOM killer's SIGKILL reads the same): memory first
GENERIC_DEATH = ("how the worker ended: the generic message carries no exit status; most often it is a SIGKILL "
                 "by the kernel's OOM killer (oom_killed), else the worker's own exit (worker_exit) or another "
                 "signal", OPEN["oom_killed"][1])


def open_question(cause: str, confidence: str) -> tuple:
    """``(what cannot be proved, deciding command)`` for a cause not decided with high confidence, else
    ``("", None)``; the command is the re-run under the lab where no sharper one exists."""
    if confidence == "high":
        return "", None
    return OPEN.get(cause, ("the cause: nothing in the record decides it", SCRIPT))


# =========================================================================== environment probes
def probe_lines(facts) -> list:
    """Short lines about this machine (and a run's limits) that bear on DataLoader failures; probes are extra,
    so one that fails is a line of evidence, never an error of the diagnosis."""
    try:
        return probes.environment_lines(facts.options, facts.iters, facts.source == "exception")
    except Exception as exc:  # noqa: BLE001
        return [f"environment probes failed: {exc!r}"]
