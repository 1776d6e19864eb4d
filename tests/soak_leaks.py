"""Soak: many isolated crash runs in a row must leave no process and no /dev/shm file behind.

    python tests/soak_leaks.py [--runs 50]

Mixes a SIGKILLed worker, a segfaulting worker, a spawn run with a killed worker and a timed-out hang,
then checks for stray processes (labutils.find_strays), /dev/shm/torch_* and sem.mp-* files that were
not there before, and leftover labutils-run-* temp directories. Not collected by pytest (it takes a few
minutes); tests/test_isolate.py runs a short version of it.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time

import labutils

KILL = """
import os, signal, torch
from torch.utils.data import DataLoader, Dataset
class D(Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        if i == 5:
            {crash}
        return torch.ones(256)
if __name__ == "__main__":
    for batch in DataLoader(D(), batch_size=2, num_workers=2):
        pass
"""
RUNS = [
    ("sigkill", KILL.format(crash="os.kill(os.getpid(), signal.SIGKILL)"), {}),
    ("segfault", KILL.format(crash="import ctypes; ctypes.string_at(0)"), {}),
    ("spawn-sigkill", KILL.format(crash="os.kill(os.getpid(), signal.SIGKILL)"), {"start_method": "spawn"}),
    ("hang", KILL.format(crash="import time; time.sleep(600)"), {"timeout": 4}),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    shm_before = set(labutils.leftover_shm())
    tmp_before = set(glob.glob(os.path.join(tempfile.gettempdir(), "labutils-run-*")))
    outcomes: dict = {}
    t0 = time.monotonic()
    for n in range(args.runs):
        name, code, opts = RUNS[n % len(RUNS)]
        result = labutils.run_isolated(code, **{"timeout": 120, **opts})
        outcomes.setdefault(name, []).append(result.outcome)
        assert result.outcome in ("failed", "timed_out"), (name, result)
        print(f"\r{n + 1}/{args.runs} {name:14s} {result.outcome:10s}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    strays = labutils.find_strays()
    shm_left = sorted(set(labutils.leftover_shm()) - shm_before)
    tmp_left = sorted(set(glob.glob(os.path.join(tempfile.gettempdir(), "labutils-run-*"))) - tmp_before)
    print(f"{args.runs} crash runs in {time.monotonic() - t0:.0f} s: "
          + ", ".join(f"{k} x{len(v)}" for k, v in outcomes.items()))
    print(f"stray processes: {len(strays)}  new /dev/shm files: {len(shm_left)}  temp dirs left: {len(tmp_left)}")
    return 0 if not (strays or shm_left or tmp_left) else 1


if __name__ == "__main__":
    sys.exit(main())
