"""The Diagnosis: a cause of the catalogue, its confidence, the evidence, the texts left unexplained, the
fixes; and where the failing process sits in the run's process tree."""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field
from typing import Optional

from ..machine import probes
from .causes import LOADER_CAUSES


# =========================================================================== public result type
@dataclass
class Diagnosis:
    """The cause of a run or exception, with the evidence used and the fixes.

    ``cause`` is one of :data:`CAUSES` (or ``unsupported`` / ``unknown``); ``confidence`` is
    ``"high"`` (structured evidence: exit codes, signals, PyTorch's own messages where PyTorch raised
    them, the memory watchdog or the kernel's OOM record), ``"medium"`` (a message without its origin,
    a child's stderr traceback) or ``"low"`` (a fallback: a bare hang, a SIGKILL with no memory
    evidence); ``source`` is ``"run"`` for a RunResult, ``"exception"`` for a live exception
    and ``"log"`` for a log's text.
    ``recovered`` is True when the script caught the failure and finished anyway.
    """

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
        if self.evidence:
            lines.append("evidence:")
            lines.extend(f"  - {e}" for e in self.evidence)
        if self.unexplained:
            lines.append("not explained by this cause:")
            lines.extend(f"  - {t}" for t in self.unexplained)
        if self.proves:
            lines.append("what this proves:")
            lines.extend(f"  - {t}" for t in self.proves)
        if self.cannot_prove:
            lines.append(f"what it cannot prove: {self.cannot_prove}")
        if self.decide_with:
            lines.append(f"to decide it, run on the job's machine: {self.decide_with}")
        if self.fixes:
            lines.append("fixes:")
            lines.extend(f"  - {f}" for f in self.fixes)
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


# =========================================================================== environment probes
def probe_lines(facts) -> list:
    """Short lines about this machine (and a run's limits) that bear on DataLoader failures; probes are extra,
    so one that fails is a line of evidence, never an error of the diagnosis."""
    try:
        return probes.environment_lines(facts.options, facts.iters, facts.source == "exception")
    except Exception as exc:  # noqa: BLE001
        return [f"environment probes failed: {exc!r}"]
