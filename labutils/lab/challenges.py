"""Challenges with a target, played once a case is revealed, scored on the class sheet.

A challenge fixes a scenario, the settings that must stay, the knobs a learner may turn, and what is scored
(one knob's value, or the number of knobs changed). An attempt counts only when the run kept the fixed
settings and changed nothing else; it scores only when the run finished. Where this machine lacks what a
challenge needs, it is played against its fallback (:data:`FALLBACKS`), named as such on the sheet: a
ceiling on the /dev/shm peak the lab measures, higher (16 MiB) than the private 8 MiB wall since a sampled
peak can miss a brief one, and scored at the highest peak of every attempt with the same knobs, so that
trying again until a lucky sample cannot win.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

__all__ = ["ALL_CHALLENGES", "CHALLENGES", "FALLBACKS", "Challenge", "playable", "missing_capability",
           "score_attempt"]


@dataclass(frozen=True)
class Challenge:
    """One target. ``knob`` is the knob whose value is the score (None: the count of knobs changed)."""

    id: str
    scenario: str
    text: str
    goal: str  # "max" or "min"
    knob: Optional[str] = None
    keep: dict = field(default_factory=dict)  # settings that must have these values (None: the case's own)
    free: tuple = ()  # knobs that may change; () with knob=None: every offered knob but those in keep
    needs: Optional[str] = None  # a capability: "private_shm"
    #: a run scored against a measured ceiling: it runs with the machine's own /dev/shm (no shm_size) and
    #: finishes only when the /dev/shm peak the lab measured stayed at or under this many MiB
    peak_mib: Optional[float] = None

    def describe(self, case: str) -> str:
        better = "higher" if self.goal == "max" else "lower"
        return f"{case}: {self.text} (the score is {self.knob or 'the number of knobs changed'}; {better} is better)"


CHALLENGES: dict = {c.id: c for c in [
    Challenge("shm_batch", "shm_exhausted",
              "the largest batch_size that survives an 8 MiB /dev/shm; change batch_size only",
              goal="max", knob="batch_size", keep={"shm_size": "8M"}, free=("batch_size",), needs="private_shm"),
    Challenge("oom_fewest", "oom_killed",
              "make the run finish under its memory budget with the fewest knob changes; the budget stays",
              goal="min", keep={"memory_budget": None}),
    Challenge("fd_nofile", "fd_limit",
              "the smallest open files limit that lets the script finish as written; change the limit only",
              goal="min", knob="nofile", free=("nofile",)),
]}


#: where a challenge's capability is missing: the same lesson, scored on what this machine can measure
FALLBACKS: dict = {
    "shm_batch": Challenge(
        "shm_batch_meter", "shm_exhausted",
        "(no private /dev/shm here, so the fallback target) the largest batch_size whose /dev/shm peak, as the "
        "lab measures it with this machine's own /dev/shm, stays at or under 16 MiB; change batch_size and "
        "prefetch_factor only", goal="max", knob="batch_size", keep={"num_workers": None},
        free=("batch_size", "prefetch_factor"), peak_mib=16.0),
}
ALL_CHALLENGES: dict = {**CHALLENGES, **{c.id: c for c in FALLBACKS.values()}}


def playable(challenge: Challenge, shm_support: Callable[[], tuple]) -> tuple:
    """(the challenge to play here, why the first choice cannot be scored or None): its fallback where
    this machine lacks what it needs and it has one; itself otherwise. ``shm_support`` is as for
    :func:`missing_capability`."""
    lack = missing_capability(challenge, shm_support)
    if lack and challenge.id in FALLBACKS:
        return FALLBACKS[challenge.id], lack
    return challenge, lack


def missing_capability(challenge: Challenge, shm_support: Callable[[], tuple]) -> Optional[str]:
    """Why this machine cannot score the challenge, or None when it can. ``shm_support`` is the runner's
    :func:`~labutils.runner.isolate.private_shm_support`, passed in so that the class sheet, which reads the
    challenges too, does not load the runner."""
    if challenge.needs == "private_shm":
        prefix, reason = shm_support()
        if prefix is None:
            return f"cannot be scored on this machine: it needs a private /dev/shm, and {reason}"
    return None


def _same(a, b) -> bool:
    return str(a).strip().upper() == str(b).strip().upper()


def score_attempt(challenge: Challenge, settings: dict, defaults: dict, result, learner: str = "",
                  case: str = "", shm_peak_mib: Optional[float] = None) -> dict:
    """The attempt's record: what changed, whether it counts, whether it finished, and its score
    (``shm_peak_mib``: the peak the lab measured, which a challenge with a ``peak_mib`` ceiling scores)."""
    changed = {k: v for k, v in settings.items() if not _same(v, defaults.get(k, ""))}
    why = ""
    for name, value in challenge.keep.items():
        value = defaults.get(name, "") if value is None else value
        if not _same(settings.get(name, ""), value):
            why = f"{name} must stay {value}"
    free = challenge.free or tuple(k for k in settings if k not in challenge.keep)
    extra = sorted(set(changed) - set(free))
    if extra and not why:
        why = f"only {', '.join(free)} may change; you also changed {', '.join(extra)}"
    if result.outcome == "unsupported":
        why = f"cannot be scored on this machine: {result.reason}"
    success = result.outcome == "ok"
    over = ""
    if challenge.peak_mib is not None and success:
        if shm_peak_mib is None:
            success, over = False, "no /dev/shm peak was measured"
        elif shm_peak_mib > challenge.peak_mib:
            success, over = False, f"its /dev/shm peak was {shm_peak_mib:g} MiB, over {challenge.peak_mib:g} MiB"
    if challenge.knob is None:
        score = len(changed)
    else:
        try:
            score = float(settings.get(challenge.knob) or "nan")
        except ValueError:
            score = float("nan")
        if score != score:
            why = why or f"{challenge.knob} must be set to a number"
    counted = not why
    if counted and not success:
        why = over or f"the run did not finish ({result.outcome}, {result.cause})"
    return {"learner": learner, "challenge": challenge.id, "case": case, "knobs": dict(settings),
            "changed": dict(changed), "score": score, "success": success, "counted": counted, "why": why,
            "shm_peak_mib": shm_peak_mib, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
