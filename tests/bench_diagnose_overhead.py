"""Measure what `python -m labutils diagnose` adds to the run time of a healthy training script.

    python tests/bench_diagnose_overhead.py [--runs 5] [SCRIPT]

Runs the script bare (`python SCRIPT`) and under diagnose (`python -m labutils diagnose --quiet SCRIPT`),
interleaved so that a change of machine load hits both alike, and prints the median wall time of each
and the ratio. The target (issue 19) is at most 1.10. Not collected by pytest (the name has no test_).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(os.path.dirname(HERE), "labutils", "scenarios", "ok_healthy.py")


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(cmd: list, env: dict) -> tuple:
    """(wall seconds, CPU seconds of the whole process tree) of one run."""
    c0, t0 = _cpu(), time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", nargs="?", default=DEFAULT)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--bytecode", choices=("cache", "env"), default="cache",
                        help="cache: let both commands cache bytecode in a private PYTHONPYCACHEPREFIX (what a "
                             "normal install does); env: keep this environment as it is (PYTHONDONTWRITEBYTECODE "
                             "makes every start recompile labutils)")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    if args.bytecode == "cache":
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join("/tmp", f"labutils-bench-pycache-{os.getuid()}")
    bare_cmd = [sys.executable, args.script]
    diag_cmd = [sys.executable, "-m", "labutils", "diagnose", "--quiet", args.script]
    timed(bare_cmd, env)  # warm the page cache (and the bytecode cache) for both
    timed(diag_cmd, env)
    res = {"bare": [], "diagnose": []}
    for i in range(args.runs):
        order = [("bare", bare_cmd), ("diagnose", diag_cmd)]
        for name, cmd in (order if i % 2 == 0 else order[::-1]):
            res[name].append(timed(cmd, env))
        print(f"run {i + 1}: bare {res['bare'][-1][0]:.2f} s, diagnose {res['diagnose'][-1][0]:.2f} s",
              file=sys.stderr)
    print(f"script: {args.script}   bytecode: {args.bytecode}   load average: {os.getloadavg()[0]:.1f}")
    for k, label in ((0, "wall"), (1, "CPU (user+sys, whole tree)")):
        mb = statistics.median(x[k] for x in res["bare"])
        md = statistics.median(x[k] for x in res["diagnose"])
        print(f"{label}: bare median {mb:.3f} s ({', '.join(f'{x[k]:.2f}' for x in res['bare'])}); "
              f"diagnose median {md:.3f} s ({', '.join(f'{x[k]:.2f}' for x in res['diagnose'])}); "
              f"ratio {md / mb:.3f} (+{md - mb:.3f} s; target <= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
