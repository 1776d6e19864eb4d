"""Repeated runs of the parity corpus: the distribution of outcomes under plain python against the lab's.

    python tests/tools/parity_soak.py [--runs 10] [--launcher cold,warm] [--start-method fork,spawn]
                                      [--case NAME ...] [--all]

Each case (the fast ones unless ``--all`` or ``--case``) runs ``--runs`` times under plain python and as
many times under each launcher and start method, interleaved. What a run showed is reduced to one outcome
(exit status, normalised stdout and stderr, files written, processes and /dev/shm files left; see
``tests/parity/harness.py``), and each case prints how often each outcome came under python and under the
lab. A case fails when the lab shows an outcome python never did in as many runs, or never shows python's
most frequent one: where an ending is a race (a worker's death against the main process's exit), the lab
may have its own mix of python's endings, never an ending of its own. Exit status 1 if any case failed.
Not collected by pytest; run it through ``/work/heavy`` on a shared machine.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: the parity package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))  # the checkout: labutils

from parity import harness  # noqa: E402


def _label(seen: harness.Seen, known: dict) -> str:
    """A short name for an outcome (A, B, ...), the same for the same outcome across python and the lab."""
    key = seen.outcome()
    if key not in known:
        known[key] = chr(ord("A") + len(known)) if len(known) < 26 else f"#{len(known)}"
    return known[key]


def soak(case, runs: int, launchers: list, methods: list, root: Path) -> bool:
    ok = True
    for method in methods:
        known: dict = {}
        counts = {"python": collections.Counter(), **{k: collections.Counter() for k in launchers}}
        for i in range(runs):
            counts["python"][_label(harness.run_python(case, root / f"py{i}", method), known)] += 1
            for launcher in launchers:
                seen = harness.run_lab(case, root / f"{launcher}{i}", launcher, method)
                counts[launcher][_label(seen, known)] += 1
        python = counts["python"]
        line = [f"{case.name} [{method or 'default'}]", "python " + _counts(python)]
        for launcher in launchers:
            lab = counts[launcher]
            own = set(lab) - set(python)
            missing = python.most_common(1)[0][0] not in lab
            if case.intended:  # its difference is pinned by the test; here only that it is steady
                own, missing = set(), False
            bad = bool(own) or missing
            ok = ok and not bad
            line.append(f"{launcher} {_counts(lab)}{'  <- DIFFERS' if bad else ''}")
        print("  ".join(line))
        if any(set(c) - set(python) for c in counts.values()) and not case.intended:
            for key, name in known.items():
                print(f"    {name}: rc={key[0]!r} stdout={key[1][:300]!r} stderr={key[2][-600:]!r}")
    return ok


def _counts(counter: collections.Counter) -> str:
    return ",".join(f"{k}x{n}" for k, n in sorted(counter.items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--launcher", default="cold,warm", help="comma-separated: cold, warm")
    parser.add_argument("--start-method", default="", help="comma-separated (empty: the machine's default)")
    parser.add_argument("--case", action="append", default=[], help="a case by name (repeatable)")
    parser.add_argument("--all", action="store_true", help="every case, not only the fast ones")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs: give 1 or more")
    launchers = [x for x in args.launcher.split(",") if x]
    methods = [x for x in args.start_method.split(",") if x] or [None]
    every = harness.cases()
    unknown = set(args.case) - {c.name for c in every}
    if unknown:
        parser.error(f"no such case: {', '.join(sorted(unknown))} (see tests/parity)")
    chosen = [c for c in every if (c.name in args.case if args.case else (args.all or c.fast))]
    ok = True
    with tempfile.TemporaryDirectory(prefix="parity-soak-") as tmp:
        for case in chosen:
            ok = soak(case, args.runs, launchers, methods, Path(tmp) / case.name) and ok
    print(f"load average {os.getloadavg()[0]:.1f}; {'every case as python' if ok else 'DIFFERENCES above'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
