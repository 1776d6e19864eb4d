"""``python -m labutils tour``: every registered scenario (``labutils/scenarios/``), broken then fixed, each
isolated with its own limits, as a table of the causes diagnosed; ``python -m labutils run SCENARIO``: one
scenario with the whole evidence of both runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional, Sequence

from ..runner.isolate import run_isolated
from ..scenarios import SCENARIOS, Scenario, get_scenario

__all__ = ["run_scenario", "tour_main", "run_main"]


def run_scenario(scenario, which: str):
    """Run the broken or fixed script of a scenario isolated; returns the RunResult."""
    sc = get_scenario(scenario) if isinstance(scenario, str) else scenario
    return run_isolated(file=sc.path(which), **sc.options(which).kwargs())


class _Progress:
    """A plain text progress bar on stderr (redrawn in place on a terminal, one line per step otherwise)."""

    def __init__(self, total: int, stream=None, enabled: bool = True):
        self.total, self.done, self.stream, self.enabled = total, 0, stream or sys.stderr, enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.monotonic()

    def show(self, label: str) -> None:
        if not self.enabled:
            return
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        bar = "#" * filled + "." * (width - filled)
        text = f"[{bar}] {self.done}/{self.total} {time.monotonic() - self.t0:5.0f}s  {label}"
        if self.tty:
            self.stream.write("\r" + text[:100].ljust(100))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def step(self, label: str) -> None:
        self.done += 1
        self.show(label)

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _row(sc: Scenario, broken, fixed, seconds: float) -> dict:
    b_cause = broken.cause if broken.outcome != "unsupported" else "unsupported"
    f_state = fixed.cause if fixed.outcome != "unsupported" else "unsupported"
    skipped = broken.outcome == "unsupported" or fixed.outcome == "unsupported"
    good = skipped or (b_cause == sc.expected and fixed.outcome == "ok" and f_state == "ok")
    return {"scenario": sc.id, "expected": sc.expected, "broken_cause": b_cause,
            "broken_outcome": broken.outcome, "fixed_outcome": fixed.outcome, "fixed_cause": f_state,
            "seconds": round(seconds, 1), "passed": good, "skipped": skipped,
            "reason": (broken.reason or fixed.reason) if skipped else None}


def _table(rows: list) -> str:
    head = ("scenario", "cause of the broken run", "fixed run", "seconds")
    body = []
    for r in rows:
        if r["skipped"]:
            cause, fixed = "skipped (unsupported here)", "-"
        else:
            mark = "" if r["broken_cause"] == r["expected"] else f"  (expected {r['expected']})"
            cause = r["broken_cause"] + mark
            fixed = r["fixed_outcome"] if r["fixed_cause"] == "ok" else f"{r['fixed_outcome']} ({r['fixed_cause']})"
        body.append((r["scenario"], cause, fixed, f"{r['seconds']:.1f}"))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*row) for row in body]
    return "\n".join(lines)


def _scenario(name: str) -> Scenario:
    """An argparse type: the scenario ``name``; an unknown one is a usage error (exit status 2)."""
    try:
        return get_scenario(name.strip())
    except KeyError as exc:
        raise argparse.ArgumentTypeError(exc.args[0]) from None


def tour_main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m labutils tour [--only a,b] [--json] [--list] [--quiet]``."""
    parser = argparse.ArgumentParser(prog="python -m labutils tour",
                                     description="Run every scenario, broken then fixed, and print what was "
                                                 "diagnosed.")
    parser.add_argument("--only", metavar="A,B", help="comma-separated scenario ids",
                        type=lambda text: [_scenario(name) for name in text.split(",") if name.strip()])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    chosen = args.only or list(SCENARIOS.values())
    if args.list:
        for sc in chosen:
            print(f"{sc.id:22} {sc.title}  [notebooks/{sc.notebook}.ipynb]")
        return 0
    progress = _Progress(2 * len(chosen), enabled=not args.quiet)
    rows = []
    t_all = time.monotonic()
    for sc in chosen:
        t0 = time.monotonic()
        progress.show(f"{sc.id}: broken")
        broken = run_scenario(sc, "broken")
        progress.step(f"{sc.id}: broken -> {broken.cause if broken.outcome != 'unsupported' else 'unsupported'}")
        same = sc.broken == sc.fixed and sc.broken_options == sc.fixed_options
        fixed = broken if same else run_scenario(sc, "fixed")  # `ok`: one healthy script serves as both
        progress.step(f"{sc.id}: fixed -> {fixed.outcome}")
        rows.append(_row(sc, broken, fixed, time.monotonic() - t0))
    progress.close()
    failed = [r for r in rows if not r["passed"]]
    if args.json:
        print(json.dumps({"scenarios": rows, "passed": not failed,
                          "seconds": round(time.monotonic() - t_all, 1)}, indent=2))
    else:
        print(_table(rows))
        skipped = [r for r in rows if r["skipped"]]
        for r in skipped:
            print(f"skipped {r['scenario']}: {r['reason']}")
        print(f"\n{len(rows) - len(failed) - len(skipped)} of {len(rows)} scenarios as expected"
              + (f", {len(skipped)} skipped" if skipped else "")
              + f", {time.monotonic() - t_all:.0f} s in all")
    return 1 if failed else 0


def run_main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m labutils run SCENARIO``: broken then fixed, with the full evidence of both."""
    parser = argparse.ArgumentParser(prog="python -m labutils run",
                                     description="Run one scenario, broken then fixed, and print the whole "
                                                 "evidence.")
    parser.add_argument("scenario", type=_scenario, help="a scenario id (python -m labutils tour --list)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    sc = args.scenario
    results = {}
    for which in ("broken", "fixed"):
        if not args.json:
            opts = " ".join(sc.options(which).cli_args())
            print(f"=== {sc.id} / {which}: {os.path.relpath(sc.path(which))}  ({opts})", flush=True)
        r = run_scenario(sc, which)
        results[which] = r
        if args.json:
            continue
        print(str(r))
        if r.outcome != "unsupported":
            print(str(r.diagnosis))
        out = r.stdout.strip().splitlines()[-6:]
        if out:
            print("stdout (last lines):")
            print("\n".join("  " + ln for ln in out))
        print()
    broken, fixed = results["broken"], results["fixed"]
    row = _row(sc, broken, fixed, broken.wall_time + fixed.wall_time)
    if args.json:
        print(json.dumps({"scenario": row, "broken": broken.diagnosis.to_dict(),
                          "fixed": fixed.diagnosis.to_dict()}, indent=2))
    else:
        verdict = "as expected" if row["passed"] else "NOT as expected"
        if row["skipped"]:
            verdict = f"skipped: {row['reason']}"
        print(f"{sc.id}: broken -> {row['broken_cause']} (expected {sc.expected}), fixed -> "
              f"{row['fixed_outcome']}: {verdict}.  Notebook: notebooks/{sc.notebook}.ipynb"
              + (f"\nnote: {sc.note}" if sc.note else ""))
    return 0 if row["passed"] else 1
