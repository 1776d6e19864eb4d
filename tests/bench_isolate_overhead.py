"""Benchmark: an isolated tiny-loader run against a bare ``python`` process running the same loader.

    python tests/bench_isolate_overhead.py [--repeat 5]

Runs them side by side (alternating, so machine load hits each alike) and prints the median wall time
of each and their ratios: the bare run, ``run_isolated`` from the warm launcher (the default where it
applies; the template is started once before timing) and ``run_isolated(launcher="cold")`` (a fresh
interpreter, one torch import like the bare run). DESIGN.md's target is 0.3x for the warm path. Not
collected by pytest: a benchmark, not a test. The bare timing covers the whole ``python script.py``
process; the isolated timings cover the whole ``run_isolated`` call as the notebook sees it (start,
watch, clean-up, reading the evidence).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from labutils import run_isolated

TINY_LOADER = """
import torch
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    data = TensorDataset(torch.arange(64, dtype=torch.float32).reshape(32, 2))
    total = sum(float(b[0].sum()) for b in DataLoader(data, batch_size=4, num_workers=2))
    assert total == float(sum(range(64)))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "tiny_loader.py")
        with open(script, "w") as fh:
            fh.write(TINY_LOADER)
        times: dict = {"bare": [], "warm": [], "cold": []}
        first = run_isolated(file=script)  # starts the template; warms the page cache for all three
        assert first.ok and first.launcher["kind"] == "warm", first.launcher
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, script], check=True)
            times["bare"].append(time.perf_counter() - t0)
            for kind in ("warm", "cold"):
                t0 = time.perf_counter()
                result = run_isolated(file=script, launcher="auto" if kind == "warm" else "cold")
                times[kind].append(time.perf_counter() - t0)
                assert result.ok and result.launcher["kind"] == kind, (result, result.launcher)
    med = {k: statistics.median(v) for k, v in times.items()}
    labels = {"bare": "bare python script.py", "warm": "run_isolated, warm", "cold": "run_isolated, cold"}
    for kind, label in labels.items():
        print(f"{label:22}: median {med[kind]:.3f} s  {[round(x, 3) for x in times[kind]]}")
    print(f"ratio warm / bare     : {med['warm'] / med['bare']:.3f}  (target <= 0.3)")
    print(f"ratio cold / bare     : {med['cold'] / med['bare']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
