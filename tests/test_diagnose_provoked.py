"""Confidence that means something: on the project's own scenarios, a wrong answer is never `high`.

Each broken scenario script (every cause, and the launcher and thread-refusal scenarios) runs once, isolated
and real: the same run the scenario tests read (the session's ``scenario_runs``, conftest.py). Its record is
then damaged the ways a real run damages it: an evidence file of the run directory
lost (the exit statuses of ``final.json``/``exits.jsonl``, ``loader.jsonl``, ``exc.json``, ``procs.jsonl``,
the kernel's and the watchdog's memory records), stderr cut (to its first half, to its last lines, or gone).
Each damaged record is explained again. Where the answer is no longer the scenario's cause, its confidence
must not be ``high``; where it is, it may be anything. The undamaged record must be named right (else the
test would check nothing).
"""

from __future__ import annotations

import copy

import pytest

from labutils import explain
from labutils.runner.isolate import private_shm_support
from labutils.scenarios import LAUNCH_SCENARIOS, SCENARIOS

ALL = {**{k: v for k, v in SCENARIOS.items() if k != "ok"}, **LAUNCH_SCENARIOS}


def _no_exits(r):
    for w in r.workers:
        w.exitcode = None
    for ev in r.events:
        ev["exitcode"], ev["signal"] = None, None


def _no_loader_log(r):
    r.loader_events = []


def _no_exc_json(r):
    r.exceptions = []


def _no_procs_log(r):
    r.workers = []


def _no_memory_records(r):
    r.memory_limit, r.watchdog_kills = None, []
    for w in r.workers:
        w.killed_by_watchdog = w.killed_by_kernel_oom = False


def _first_half(r):
    r.stderr = r.stderr[: len(r.stderr) // 2]


def _last_lines(r):
    r.stderr = "\n".join(r.stderr.splitlines()[-6:])


def _no_stderr(r):
    r.stderr = ""


PROVOCATIONS = {"exit statuses lost": _no_exits, "loader.jsonl lost": _no_loader_log, "exc.json lost": _no_exc_json,
                "procs.jsonl lost": _no_procs_log, "memory records lost": _no_memory_records,
                "stderr cut to its first half": _first_half, "stderr cut to its last 6 lines": _last_lines,
                "stderr lost": _no_stderr}


def provoked(result, name):
    damaged = copy.deepcopy(result)
    damaged.__dict__.pop("_diagnosis", None)
    PROVOCATIONS[name](damaged)
    return explain(damaged)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=sc.gap))
                                  if sc.gap else n for n, sc in ALL.items()])
def test_no_wrong_answer_is_high(name, scenario_runs):
    sc = ALL[name]
    opts = sc.options("broken")
    if opts.shm_size and private_shm_support()[0] is None:
        pytest.skip("a private /dev/shm cannot be mounted here")
    result = scenario_runs.result(sc, "broken")  # skipped where the run could not start
    assert result.diagnosis.cause == sc.expected, result.diagnosis  # the undamaged record is named right
    wrong = []
    for how in PROVOCATIONS:
        d = provoked(result, how)
        if d.cause != sc.expected:
            wrong.append(f"{how}: {d.cause} ({d.confidence}): {d.summary}")
            assert d.confidence != "high", f"{name}, {how}: a wrong answer with high confidence:\n{d}"
    print(f"{name}: {len(wrong)} of {len(PROVOCATIONS)} damaged records named otherwise, none high",
          *wrong, sep="\n  ")
