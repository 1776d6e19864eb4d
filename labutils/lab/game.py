"""The prediction game of the lab: anonymous cases, the learner's predictions, the reveal, the class sheet.

Every scenario id is also its cause id, so the game never shows one before the learner has answered:
:func:`deal` names the scenarios "Case A", "Case B", ... in an order seeded by the learner's name (a class
does not share one answer key), and :func:`neutral_copy` runs a copy of the script named after the case.
Before its reveal every case shows the same setup line (:data:`HIDDEN_SETUP`) and no limit line on the chart,
since the limit a case needs would name it (only one case runs under 128 open files). Nothing here draws a
widget: :class:`ClassSheet` keeps the records, :mod:`labutils.lab.widget` shows them.
"""

from __future__ import annotations

import csv
import hashlib
import html
import json
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

from .challenges import ALL_CHALLENGES

__all__ = ["Answer", "ClassSheet", "Deal", "HIDDEN_SETUP", "TOLERANCE", "case_name", "deal", "export_name",
           "neutral_copy", "number_close", "observed_numbers", "parse_number", "prediction_options", "reveal_html",
           "setup_text"]

MIB = 1024 * 1024
#: a predicted number counts as right when it is within this share of the measured one (or within 1 of it,
#: for the small numbers where a share means nothing: 2 batches against 3)
TOLERANCE = 0.2
TOLERANCE_TEXT = f"within {TOLERANCE:.0%} (or 1) of what was measured"
#: the setup line of every case before its reveal (the same words for all: the limits come at the reveal)
HIDDEN_SETUP = ("Run setup: this case runs under limits of its own (perhaps a memory budget, a /dev/shm size, an "
                "open-files or process limit, a start method; perhaps none). As in real life, nothing announces "
                "them: they are shown at the reveal. Read what the run prints and how the chart moves.")


def number_close(predicted: Optional[float], observed) -> Optional[bool]:
    """Whether a predicted number is within :data:`TOLERANCE` of the observed one (None when either is missing)."""
    if predicted is None or observed is None:
        return None
    return abs(float(predicted) - float(observed)) <= max(TOLERANCE * abs(float(observed)), 1.0)


def export_name(learner: str) -> str:
    """The default file of a learner's export: ``lab_answers_<name>.csv`` (the name made safe for a file)."""
    safe = re.sub(r"[^A-Za-z0-9_-]+", "_", learner.strip()).strip("_")
    return f"lab_answers_{safe or 'anonymous'}.csv"


def case_name(index: int) -> str:
    """``0 -> "Case A"``, ``25 -> "Case Z"``, ``26 -> "Case AA"``."""
    letters = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        letters = chr(ord("A") + rem) + letters
    return f"Case {letters}"


@dataclass(frozen=True)
class Deal:
    """One learner's cases: ``cases[name] = scenario id``, in the learner's order."""

    learner: str
    cases: dict

    def scenario_of(self, case: str) -> str:
        return self.cases[case]

    def case_of(self, scenario_id: str) -> str:
        return next(c for c, s in self.cases.items() if s == scenario_id)


def deal(scenario_ids, learner: str = "") -> Deal:
    """The scenarios as cases, shuffled by a seed taken from the learner's name (stable run to run)."""
    ids = sorted(scenario_ids)
    seed = int.from_bytes(hashlib.sha256(learner.strip().lower().encode()).digest()[:8], "big")
    random.Random(seed).shuffle(ids)
    return Deal(learner.strip(), {case_name(i): sid for i, sid in enumerate(ids)})


def prediction_options(causes, catalogue) -> list:
    """Dropdown options for a prediction: what each cause looks like (its catalogue title), never its id."""
    opts = [("(pick what you think happened)", "")]
    opts += [(catalogue[c].title, c) for c in causes]
    opts.append(("none of these (unknown)", "unknown"))
    return opts


def neutral_copy(script: str, case: str) -> str:
    """A copy of ``script`` named after the case (``.../case_c.py`` in a fresh temporary folder)."""
    folder = tempfile.mkdtemp(prefix="lab-case-")
    dest = os.path.join(folder, case.lower().replace(" ", "_") + ".py")
    shutil.copyfile(script, dest)
    return dest


def remove_copy(path: str) -> None:
    """Remove a folder made by :func:`neutral_copy` (only one whose name says it is ours)."""
    folder = os.path.dirname(path)
    if os.path.basename(folder).startswith("lab-case-"):
        shutil.rmtree(folder, ignore_errors=True)


def parse_number(text: str, what: str) -> Optional[float]:
    """``""`` -> None; ``"56"`` -> 56.0; anything else raises ValueError with one clear line."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number; give e.g. 40, or leave it empty") from None
    if value < 0 or value != value:
        raise ValueError(f"{what}: {text!r} must be a number of 0 or more")
    return value


def setup_text(options: dict) -> str:
    """A run's limits, every one named, set or not (what a revealed case shows; a hidden one shows
    :data:`HIDDEN_SETUP`)."""
    def show(value, unit="", none="not set"):
        return none if value in (None, "") else f"{value}{unit}"

    parts = [
        f"start method: {show(options.get('start_method'), none='the default')}",
        f"time limit: {show(options.get('timeout'), ' s')}",
        f"memory budget: {show(options.get('memory_budget'))}",
        f"/dev/shm size: {show(options.get('shm_size'), none='the machine’s')}",
        f"open files limit: {show(options.get('nofile'), none='the machine’s')}",
        f"process limit: {show(options.get('max_processes'))}",
    ]
    return "Run setup: " + "; ".join(parts)


def observed_numbers(result, snapshot: Optional[dict]) -> dict:
    """What the run showed: batches delivered before it ended, and the peak of /dev/shm in use (MiB).

    Batches: the largest count of the run's own progress record (the chart's last sample can miss the
    final batches). /dev/shm: where the run had its own /dev/shm (``shm_size``), the peak its tmpfs held;
    otherwise the peak over samples of the shared pages mapped by the run's processes, summed.
    """
    batches = max((e.get("batches", 0) for e in result.loader_events if e.get("event") == "progress"),
                  default=None)
    if snapshot is not None and batches is None and snapshot["batches"][1]:
        batches = max(snapshot["batches"][1])
    shm = None
    if snapshot is not None:
        shm = snapshot.get("shm_peak_mib")
    return {"batches": batches, "shm_mib": None if shm is None else round(shm, 1)}


@dataclass
class Answer:
    """One prediction of one case, and what the run showed."""

    learner: str
    case: str
    predicted: str
    predicted_batches: Optional[float] = None
    predicted_shm_mib: Optional[float] = None
    scenario: str = ""  # filled in at the reveal
    diagnosed: str = ""
    correct: Optional[bool] = None
    observed_batches: Optional[int] = None
    observed_shm_mib: Optional[float] = None
    notebook: str = ""
    revealed: bool = False
    knobs: str = ""  # a number predicted after the reveal: the knobs changed from the case's own ("k=v, ...")
    batches_close: Optional[bool] = None  # the predicted number within TOLERANCE of the observed one
    shm_close: Optional[bool] = None
    time: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S"))


FIELDS = [f for f in Answer.__dataclass_fields__]


def score_numbers(answer: Answer) -> None:
    """Mark each predicted number of ``answer`` close or not (:func:`number_close`)."""
    answer.batches_close = number_close(answer.predicted_batches, answer.observed_batches)
    answer.shm_close = number_close(answer.predicted_shm_mib, answer.observed_shm_mib)


def _mark(close: Optional[bool]) -> str:
    return "-" if close is None else ("<b style='color:#1a7f37'>yes</b>" if close
                                      else "<b style='color:#cf222e'>no</b>")


def _num(value) -> str:
    return "-" if value is None else (f"{value:g}" if isinstance(value, float) else str(value))


def reveal_html(answer: Answer, scenario, diagnosis) -> str:
    """The reveal: right or not, the cause, the evidence that decided it, numbers, the lesson to read."""
    right = answer.correct
    mark = ("<b style='color:#1a7f37'>right</b>" if right
            else "<b style='color:#cf222e'>not this time</b>" if answer.predicted else "no cause predicted")
    evidence = "".join(f"<li>{html.escape(str(e))}</li>" for e in list(diagnosis.evidence)[:4])
    rows = ""
    for what, p, o, close in (
            ("batches delivered", answer.predicted_batches, answer.observed_batches, answer.batches_close),
            ("/dev/shm peak (MiB)", answer.predicted_shm_mib, answer.observed_shm_mib, answer.shm_close)):
        if p is not None:
            rows += f"<tr><td>{what}</td><td>{_num(p)}</td><td>{_num(o)}</td><td>{_mark(close)}</td></tr>"
    numbers = (f"<table class='lab-numbers'><tr><th></th><th>you predicted</th><th>observed</th>"
               f"<th>close? ({TOLERANCE_TEXT})</th></tr>{rows}</table>" if rows else "")
    return (
        f"<div class='lab-reveal'><b>{html.escape(answer.case)}</b> was <code>{html.escape(scenario.id)}</code>:"
        f" {html.escape(scenario.title)} (script <code>{html.escape(os.path.basename(scenario.broken))}</code>)."
        f"<br>Your prediction: {mark}. The diagnosis: <code>{html.escape(diagnosis.cause)}</code>"
        f" ({html.escape(diagnosis.confidence)} confidence). What decided it:"
        f"<ul style='margin:2px 0'>{evidence}</ul>{numbers}"
        f"Read next: <code>notebooks/{html.escape(scenario.notebook)}.ipynb</code></div>"
    )


class ClassSheet:
    """The class's predictions, reveals and challenge scores; exported as CSV or JSON for the instructor."""

    def __init__(self):
        self.answers: list = []
        self.numbers: list = []  # numbers predicted for a revealed case's run with its knobs turned (Answers)
        self.attempts: list = []  # challenge attempts (dicts, see labutils.lab.challenges)

    @property
    def correct(self) -> int:
        return sum(1 for a in self.answers if a.correct)

    def numbers_score(self) -> tuple:
        """(numbers predicted close, numbers predicted and measured), over predictions and knob numbers."""
        marks = [m for a in self.answers + self.numbers for m in (a.batches_close, a.shm_close) if m is not None]
        return sum(marks), len(marks)

    def best_scores(self) -> dict:
        """``{(learner, challenge): best attempt}`` over the attempts that counted and finished."""
        best: dict = {}
        for a in self.attempts:
            if not a["counted"] or not a["success"]:
                continue
            key = (a["learner"], a["challenge"])
            goal = ALL_CHALLENGES[a["challenge"]].goal
            old = best.get(key)
            if old is None or (a["score"] > old["score"] if goal == "max" else a["score"] < old["score"]):
                best[key] = a
        return best

    def rows(self) -> list:
        """Every record, one dict each: ``kind`` is ``prediction``, ``number`` or ``challenge``."""
        out = [dict(asdict(a), kind="prediction") for a in self.answers]
        out += [dict(asdict(a), kind="number") for a in self.numbers]
        out += [dict(a, kind="challenge") for a in self.attempts]
        return out

    def export(self, path: str) -> str:
        """Write the sheet to ``path``: ``.json`` (predictions, challenge attempts, best scores) or CSV."""
        path = os.path.abspath(os.path.expanduser(path))
        if path.endswith(".json"):
            data = {"predictions": [asdict(a) for a in self.answers], "numbers": [asdict(a) for a in self.numbers],
                    "challenges": self.attempts,
                    "best": [dict(v) for v in self.best_scores().values()]}
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=2)
            return path
        fields = ["kind"] + FIELDS + [k for k in _ATTEMPT_FIELDS if k not in FIELDS]
        with open(path, "w", encoding="utf-8", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(self.rows())
        return path

    def html(self) -> str:
        """The sheet as the Class tab shows it (only revealed cases name their cause)."""
        close, scored = self.numbers_score()
        head = f"<b>Score: {self.correct} of {len(self.answers)}</b> predictions right" + (
            f"; <b>{close} of {scored}</b> numbers close ({TOLERANCE_TEXT})" if scored else "")
        rows = "".join(
            f"<tr><td>{html.escape(a.learner)}</td><td>{html.escape(a.case)}</td>"
            f"<td>{html.escape(a.scenario) if a.revealed else '(not revealed yet)'}</td>"
            f"<td>{'yes' if a.correct else ('no' if a.revealed else '-')}</td>"
            f"<td>{_num(a.predicted_batches)} / {_num(a.observed_batches) if a.revealed else '-'}</td>"
            f"<td>{_num(a.predicted_shm_mib)} / {_num(a.observed_shm_mib) if a.revealed else '-'}</td></tr>"
            for a in self.answers)
        table = ("<table><tr><th>name</th><th>case</th><th>cause</th><th>right</th>"
                 "<th>batches (you / seen)</th><th>/dev/shm MiB (you / seen)</th></tr>" + rows + "</table>"
                 if rows else "")
        numbers = "".join(
            f"<tr><td>{html.escape(a.learner)}</td><td>{html.escape(a.case)}</td><td>{html.escape(a.knobs)}</td>"
            f"<td>{_num(a.predicted_batches)} / {_num(a.observed_batches)}</td>"
            f"<td>{_num(a.predicted_shm_mib)} / {_num(a.observed_shm_mib)}</td></tr>" for a in self.numbers)
        if numbers:
            table += ("<br><b>Numbers</b> (predicted for a revealed case, knobs turned)<table><tr><th>name</th>"
                      "<th>case</th><th>knobs</th><th>batches (you / seen)</th><th>/dev/shm MiB (you / seen)</th>"
                      "</tr>" + numbers + "</table>")
        best = self.best_scores()
        scores = "".join(
            f"<tr><td>{html.escape(k[0])}</td><td>{html.escape(k[1])}</td><td>{_num(v['score'])}</td></tr>"
            for k, v in sorted(best.items()))
        board = ("<br><b>Challenges</b> (best that counted)<table><tr><th>name</th><th>challenge</th>"
                 f"<th>score</th></tr>{scores}</table>" if scores else "")
        return head + table + board


_ATTEMPT_FIELDS = ["challenge", "case", "knobs", "changed", "score", "success", "counted", "why", "shm_peak_mib"]
