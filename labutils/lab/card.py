"""The result card: how a notebook shows one isolated run (:class:`~labutils.runner.result.RunResult`, which the
card reads, asking the diagnosis for the cause). With ``hide_cause`` (``%%isolate --hide-cause``) the evidence
comes first and the lab's diagnosis is folded below it, so the learner names the cause before reading it.
Stacks show the learner's frames: the lab's runner's and runpy's are left out, the full stderr one click away.
"""

from __future__ import annotations

import html
import re

from ..runner.result import RunResult

TAIL_LINES = 12
_FRAME = re.compile(r'^(?P<indent>\s*)File "(?P<path>[^"]+)", line \d+')
_COLOUR = {"ok": "#1a7f37", "failed": "#cf222e", "timed_out": "#9a6700", "unsupported": "#6e7781"}
_BOX = "border:1px solid #d0d7de;border-radius:6px;padding:6px 10px;margin:4px 0"
_PRE = "<pre style='font-size:85%'>{}</pre>"
PROMPT = "What killed it? Read the evidence, name the cause, then open the lab's diagnosis below."


def lab_frame(path: str) -> bool:
    """True for a frame of the lab's own runner or of runpy, which every isolated script runs under."""
    path = path.replace("\\", "/")
    return "/labutils/runner/" in path or path == "<frozen runpy>" or path.endswith("/runpy.py")


def learner_lines(lines: list) -> tuple:
    """``(kept, dropped)``: the lines without the lab's frames (a traceback frame's source and caret lines
    go with it; a faulthandler frame is one line), and how many lines were left out."""
    kept, dropped, skip_indent = [], 0, None
    for line in lines:
        m = _FRAME.match(line)
        if skip_indent is not None and not m and len(line) - len(line.lstrip()) > skip_indent and line.strip():
            dropped += 1  # the dropped frame's source line or its ^^^^ markers
            continue
        skip_indent = None
        if m and lab_frame(m.group("path")):
            skip_indent = len(m.group("indent"))
            dropped += 1
            continue
        kept.append(line)
    return kept, dropped


def stderr_view(result: RunResult, n: int = TAIL_LINES) -> tuple:
    """``(tail, dropped)``: the last ``n`` stderr lines worth reading, the lab's frames left out."""
    kept, dropped = learner_lines(result.stderr_tail(10**6))
    return kept[-n:], dropped


def _cause_line(result: RunResult) -> tuple:
    """``(cause, summary, confidence)`` from the diagnosis, or ``(None, why it failed, None)``."""
    try:
        d = result.diagnosis
    except Exception as exc:  # noqa: BLE001 - a card never fails to show a result
        return None, f"diagnosis failed: {exc!r}", None
    return d.cause, d.summary, d.confidence


def _doubt(confidence) -> str:
    """What a cause that is not certain carries on the card: ``oom_killed?`` for a SIGKILL with no memory
    evidence reads as the guess it is, beside a summary that says nothing recorded it was for memory."""
    return "" if confidence in (None, "high") else f"? ({confidence} confidence)"


def card_text(result: RunResult, hide_cause: bool = False) -> str:
    """The card as text: the cause first (or, hidden, last), the record, the stderr tail."""
    lines = result.summary_lines()
    cause, summary, conf = _cause_line(result) if result.outcome != "unsupported" else (None, None, None)
    head = f"cause: {cause}{_doubt(conf)} - {summary}" if cause else (f"cause: ({summary})" if summary else None)
    tail, dropped = stderr_view(result, 8)
    if tail:
        lines.append("stderr (last lines" + (f"; {dropped} lines of the lab's runner and runpy left out)"
                                             if dropped else ")") + ":")
        lines.extend("  " + ln for ln in tail)
    if head and hide_cause:
        return "\n".join([PROMPT, *lines, "the lab's diagnosis: " + head])
    return "\n".join(([head] if head else []) + lines)


def card_html(result: RunResult, hide_cause: bool = False) -> str:
    """The card as HTML: outcome badge and cause, the record, stdout and stderr tails (stderr without the
    lab's frames, the full text folded below); with ``hide_cause`` the cause sits in a closed block last."""
    esc = html.escape
    badge = (f"<span style='background:{_COLOUR.get(result.outcome, '#444')};color:white;padding:1px 6px;"
             f"border-radius:3px'>{esc(result.outcome)}</span>")
    cause, summary, conf = _cause_line(result)
    said = (f"<b>cause: <code>{esc(cause)}</code>{esc(_doubt(conf))}</b> &mdash; {esc(summary)}" if cause
            else f"({esc(summary)})")
    head = f"{badge} <i>{esc(PROMPT)}</i>" if hide_cause else f"{badge} {said}"
    rows = "".join(f"<li>{esc(line)}</li>" for line in result.summary_lines())
    parts = [f"<div>{head}</div><ul style='margin:4px 0'>{rows}</ul>"]
    out = "\n".join(result.stdout.strip().splitlines()[-TAIL_LINES:])
    if out:
        parts.append(f"<details><summary>stdout (last lines)</summary>{_PRE.format(esc(out))}</details>")
    tail, dropped = stderr_view(result)
    if tail:
        note = f"; {dropped} lines of the lab's runner and runpy left out" if dropped else ""
        parts.append(f"<details{' open' if hide_cause else ''}><summary>stderr (last lines{note})</summary>"
                     f"{_PRE.format(esc(chr(10).join(tail)))}</details>")
    if dropped:
        parts.append(f"<details><summary>full stderr, with the lab's frames</summary>"
                     f"{_PRE.format(esc(result.stderr.strip()))}</details>")
    if hide_cause:
        parts.append(f"<details><summary>show the lab's diagnosis</summary><div>{said}</div></details>")
    return f"<div style='{_BOX}'>{''.join(parts)}</div>"


class Card:
    """A result as the notebook shows it: ``display(Card(result, hide_cause=True))``."""

    def __init__(self, result: RunResult, hide_cause: bool = False):
        self.result, self.hide_cause = result, hide_cause

    def _repr_html_(self) -> str:
        return card_html(self.result, self.hide_cause)

    def __str__(self) -> str:
        return card_text(self.result, self.hide_cause)

    def __repr__(self) -> str:
        return str(self)
