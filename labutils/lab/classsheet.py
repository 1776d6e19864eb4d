"""The class's sheets merged: what an instructor reads in the last ten minutes of a workshop.

:func:`merge` reads the learners' exports of the lab's Class tab (:meth:`labutils.lab.game.ClassSheet.export`)
and :meth:`ClassReport.text` prints, in one screen, the confusion table, the cases most often missed, the
number predictions' errors (scored as the lab scores them) and the best challenge scores. A file that is not
an export, or that brings a learner already read, is named with the reason and skipped, never a traceback.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from . import game
from .challenges import ALL_CHALLENGES

__all__ = ["ClassReport", "CODES", "merge", "read_export"]

#: three letters per cause, the confusion table's column heads (the legend prints them)
CODES = {"ok": "ok", "worker_exception": "wex", "unpicklable_dataset": "pkl", "main_not_importable": "imp",
         "missing_main_guard": "grd", "native_crash": "seg", "oom_killed": "oom", "shm_exhausted": "shm",
         "fd_limit": "fds", "fork_refused": "frk", "worker_exit": "ext", "timeout": "tmo", "hang": "hng",
         "cuda_in_worker": "cda", "outside_loader": "out", "unknown": "unk"}
_NEEDED = {"kind", "learner", "case", "predicted", "scenario", "revealed"}


class BadSheet(ValueError):
    """A file that is not a lab export; the message says why in one line."""


def _bool(value) -> Optional[bool]:
    if isinstance(value, bool) or value is None:
        return value
    text = str(value).strip().lower()
    return True if text == "true" else False if text == "false" else None


def _float(value) -> Optional[float]:
    try:
        return None if value in (None, "") else float(value)
    except (TypeError, ValueError):
        return None


def _rows_of_json(data) -> list:
    if not isinstance(data, dict) or "predictions" not in data or "challenges" not in data:
        raise BadSheet("JSON, but not a lab export (no 'predictions' and 'challenges')")
    rows = [dict(r, kind="prediction") for r in data.get("predictions") or []]
    rows += [dict(r, kind="number") for r in data.get("numbers") or []]
    rows += [dict(r, kind="challenge") for r in data.get("challenges") or []]
    if not all(isinstance(r, dict) for r in rows):
        raise BadSheet("JSON, but its records are not the lab's")
    return rows


def read_export(path: str) -> list:
    """The records of one export, as dicts with a ``kind``; raises :class:`BadSheet` with the reason."""
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            text = fh.read()
    except UnicodeDecodeError:
        raise BadSheet("not text (not UTF-8): not a lab export") from None
    except OSError as exc:
        raise BadSheet(f"cannot be read ({exc.strerror or exc})") from None
    if not text.strip():
        raise BadSheet("empty")
    if text.lstrip().startswith("{"):
        try:
            return _rows_of_json(json.loads(text))
        except json.JSONDecodeError as exc:
            raise BadSheet(f"broken JSON (line {exc.lineno}): not a lab export") from None
    try:
        reader = csv.DictReader(text.splitlines())
        header = set(reader.fieldnames or ())
        missing = sorted(_NEEDED - header)
        if missing:
            raise BadSheet(f"a CSV without the lab's columns ({', '.join(missing)} missing): another tool's file?")
        rows = [r for r in reader if r.get("kind") in ("prediction", "number", "challenge")]
    except csv.Error as exc:
        raise BadSheet(f"not a readable CSV ({exc})") from None
    if not rows:
        raise BadSheet("a lab export with no records yet (nothing predicted)")
    return rows


@dataclass
class ClassReport:
    """The merged sheets. ``skipped`` holds ``(file, reason)``; ``files`` the files read."""

    files: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    learners: dict = field(default_factory=dict)  # learner -> the file it came from
    predictions: list = field(default_factory=list)
    numbers: list = field(default_factory=list)  # (learner, scenario, what, predicted, observed)
    attempts: list = field(default_factory=list)

    def confusion(self) -> Counter:
        """``{(actual scenario, predicted cause): count}`` over the revealed, scored predictions."""
        return Counter((p["scenario"], p["predicted"] or "unknown") for p in self.predictions)

    def missed(self, top: int = 5) -> list:
        """``[(scenario, wrong, total, most common wrong prediction or None)]``, most missed first."""
        out = []
        for sid in sorted({p["scenario"] for p in self.predictions}):
            mine = [p for p in self.predictions if p["scenario"] == sid]
            wrong = [p["predicted"] or "unknown" for p in mine if not p["correct"]]
            if wrong:
                out.append((sid, len(wrong), len(mine), Counter(wrong).most_common(1)[0]))
        return sorted(out, key=lambda r: (-r[1] / r[2], -r[1], r[0]))[:top]

    def number_errors(self) -> dict:
        """``{what: (predicted and measured, close, median relative error, worst (learner, scenario, p, o))}``."""
        out = {}
        for what in ("batches", "/dev/shm MiB"):
            pairs = [n for n in self.numbers if n[2] == what]
            if not pairs:
                continue
            close = sum(1 for n in pairs if game.number_close(n[3], n[4]))
            errors = [abs(n[3] - n[4]) / max(abs(n[4]), 1.0) for n in pairs]
            worst = pairs[max(range(len(pairs)), key=errors.__getitem__)]
            out[what] = (len(pairs), close, statistics.median(errors), worst)
        return out

    def best(self) -> list:
        """``[(challenge, best score, learners who got it, learners who scored at all)]``."""
        out = []
        for cid in sorted({a["challenge"] for a in self.attempts}):
            done = [a for a in self.attempts if a["challenge"] == cid and a["counted"] and a["success"]
                    and a["score"] is not None]
            if not done:
                out.append((cid, None, [], 0))
                continue
            pick = max if getattr(ALL_CHALLENGES.get(cid), "goal", "max") == "max" else min
            top = pick(a["score"] for a in done)
            who = sorted({a["learner"] for a in done if a["score"] == top})
            out.append((cid, top, who, len({a["learner"] for a in done})))
        return out

    def text(self) -> str:
        lines = [f"Class sheet: {len(self.learners)} learners from {len(self.files)} files, "
                 f"{len(self.predictions)} revealed predictions"
                 + (f" ({len(self.skipped)} files skipped)" if self.skipped else "")]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped]
        if self.predictions:
            lines += ["", "Confusion: the case's real cause (rows) against the cause predicted (columns)"]
            lines += self._table()
            lines += ["", "Most often missed:"]
            missed = self.missed()
            lines += [f"  {sid}: {wrong} of {total} wrong, most often taken for {guess} ({times})"
                      for sid, wrong, total, (guess, times) in missed] or ["  nothing: every case was named"]
        numbers = self.number_errors()
        if numbers:
            lines += ["", f"Numbers predicted (close = {game.TOLERANCE_TEXT}):"]
            for what, (n, close, median, worst) in numbers.items():
                lines.append(f"  {what}: {close} of {n} close, median error {median:.0%}; furthest: {worst[0]} "
                             f"on {worst[1]}, {worst[3]:g} predicted, {worst[4]:g} measured")
        best = self.best()
        if best:
            lines += ["", "Challenges (the best score that counted):"]
            for cid, top, who, scored in best:
                lines.append(f"  {cid}: no finished attempt counted" if top is None else
                             f"  {cid}: {top:g} by {_names(who)} ({scored} learners scored)")
        return "\n".join(lines)

    def _table(self) -> list:
        table = self.confusion()
        actual = sorted({a for a, _ in table})
        predicted = [c for c in CODES if any(p == c for _, p in table)]
        predicted += sorted({p for _, p in table} - set(predicted))
        width = max(len(a) for a in actual)
        head = " " * width + " " + "".join(f"{CODES.get(p, p[:3]):>4}" for p in predicted) + "  right"
        rows = [head]
        for a in actual:
            cells = "".join(f"{table.get((a, p), 0) or '.':>4}" for p in predicted)
            total = sum(table.get((a, p), 0) for p in predicted)
            rows.append(f"{a:<{width}} {cells}  {table.get((a, a), 0)}/{total}")
        legend = ", ".join(f"{CODES.get(p, p[:3])}={p}" for p in predicted)
        return rows + textwrap.wrap(f"({legend})", 100, initial_indent="  ", subsequent_indent="   ")

    def __str__(self) -> str:
        return self.text()


def _names(who: list, most: int = 3) -> str:
    return ", ".join(who[:most]) + (f" and {len(who) - most} more" if len(who) > most else "")


def _learner(row: dict, path: str) -> str:
    return str(row.get("learner") or "").strip() or f"(no name: {os.path.basename(path)})"


def _add(report: ClassReport, rows: list) -> None:
    for r in rows:
        who = _learner(r, "")
        if r["kind"] == "challenge":
            report.attempts.append({"learner": r.get("learner") or who, "challenge": r.get("challenge") or "?",
                                    "score": _float(r.get("score")), "success": bool(_bool(r.get("success"))),
                                    "counted": bool(_bool(r.get("counted")))})
            continue
        sid = str(r.get("scenario") or "")
        if r["kind"] == "prediction" and _bool(r.get("revealed")) and sid:
            report.predictions.append({"learner": r.get("learner"), "scenario": sid,
                                       "predicted": str(r.get("predicted") or ""),
                                       "correct": bool(_bool(r.get("correct")))})
        for what, p, o in (("batches", "predicted_batches", "observed_batches"),
                           ("/dev/shm MiB", "predicted_shm_mib", "observed_shm_mib")):
            pv, ov = _float(r.get(p)), _float(r.get(o))
            if pv is not None and ov is not None and sid:
                report.numbers.append((r.get("learner") or "?", sid, what, pv, ov))


def merge(paths) -> ClassReport:
    """Read every export in ``paths``; bad files and learners already read are named in ``skipped``."""
    report = ClassReport()
    for path in paths:
        name = os.path.basename(path) or path
        try:
            rows = read_export(path)
        except BadSheet as exc:
            report.skipped.append((name, str(exc)))
            continue
        learners = {_learner(r, path) for r in rows}
        again = sorted(who for who in learners if who in report.learners)
        if again:
            report.skipped.append((name, f"learner {', '.join(again)} already read from "
                                         f"{report.learners[again[0]]}"))
            continue
        for r in rows:
            if not str(r.get("learner") or "").strip():
                r["learner"] = _learner(r, path)
        report.learners.update({who: name for who in learners})
        report.files.append(name)
        _add(report, rows)
    return report
