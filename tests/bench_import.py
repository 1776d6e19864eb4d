"""Benchmark: what ``import labutils`` adds to a bare interpreter (DESIGN.md's target: at most 0.03 s).

    python tests/bench_import.py [--repeat 21]

Starts ``python -c pass`` and ``python -c "import labutils"`` in turns (so machine load hits both alike),
each a fresh process, and prints the median wall time of each, their difference, and how many labutils
modules the import loads. Also times ``import labutils`` followed by ``labutils.emit`` (what every isolated
cell that emits pays). Not collected by pytest: a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "bare": "pass",
    "import labutils": "import labutils",
    "import + emit": "import labutils; labutils.emit",
}
COUNT = "import sys, labutils; print(sum(m.split('.')[0] == 'labutils' for m in sys.modules))"


def _time(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/bench_import.py", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21, help="runs of each case (default 21)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat: give 1 or more")
    times = {name: [] for name in CASES}
    for _ in range(args.repeat):
        for name, code in CASES.items():
            times[name].append(_time(code))
    bare = statistics.median(times["bare"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:16} median {median * 1000:7.1f} ms   over bare {1000 * (median - bare):6.1f} ms")
    modules = subprocess.run([sys.executable, "-c", COUNT], capture_output=True, text=True, check=True).stdout
    print(f"labutils modules loaded by the import: {modules.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
