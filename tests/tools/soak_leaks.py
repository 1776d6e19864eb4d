"""Soak: many isolated crash runs in a row, beside a bystander and a second lab, must leave nothing behind
and take nothing from the neighbours.

    python tests/tools/soak_leaks.py [--runs 100] [--no-neighbours]

The first lab (this process) mixes a SIGKILLed worker, a segfaulting worker, a spawn run with a killed
worker and a timed-out hang. Meanwhile, unless ``--no-neighbours``:

* a **bystander** (an ordinary program, not a lab run) iterates its own spawn DataLoader with the
  ``file_system`` sharing strategy, so it owns named semaphores and ``/dev/shm/torch_*`` segments the whole
  time; it checks after every batch that its values are right and that every file it holds still exists;
* a **second lab** (another process) does healthy spawn runs with ``labutils.run_isolated``; each must be ok.

At the end: stray processes (labutils.find_strays), /dev/shm/torch_* and sem.mp-* files of the first lab's
runs that remain, its labutils-run-* directories left (in a temp folder of its own), and the neighbours'
reports. Not collected by
pytest (it takes minutes); tests/test_runner_shared.py runs a short version.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
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

# An ordinary program beside the lab: its own spawn DataLoader, file_system strategy, its own files.
BYSTANDER = r'''
import json, multiprocessing as mp, os, sys, time
import torch, torch.multiprocessing as tmp
from torch.utils.data import DataLoader, Dataset

class Rows(Dataset):
    def __len__(self):
        return 10**9
    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.full((64,), float(i % 1000))

def shm_name(t):
    return t.untyped_storage()._share_filename_cpu_()[1].decode().lstrip("/")

if __name__ == "__main__":
    status, stop = sys.argv[1], sys.argv[2]
    tmp.set_sharing_strategy("file_system")
    ctx = mp.get_context("spawn")
    locks = [ctx.Lock() for _ in range(4)]          # named semaphores the bystander owns
    sems = ["sem." + lk._semlock.name.lstrip("/") for lk in locks]
    loader = DataLoader(Rows(), batch_size=8, num_workers=2, multiprocessing_context=ctx,
                        persistent_workers=True)
    kept, errors, batches, checked = [], [], 0, 0
    last = 0.0
    for start, batch in zip(range(0, 10**9, 8), loader):
        batches += 1
        want = torch.tensor([float(i % 1000) for i in range(start, start + 8)])
        if not torch.equal(batch[:, 0], want):
            errors.append(f"batch {batches}: wrong values")
        kept = (kept + [batch])[-8:]                  # keep the last 8 batches (and their segments)
        for name in [shm_name(b) for b in kept] + sems:
            checked += 1
            if not os.path.exists("/dev/shm/" + name):
                errors.append(f"batch {batches}: /dev/shm/{name} vanished while in use")
        for lk in locks:
            if not lk.acquire(timeout=5):
                errors.append("a semaphore stopped working")
            lk.release()
        now = time.time()
        if now - last > 0.5 or os.path.exists(stop):
            last = now
            with open(status + ".tmp", "w") as fh:
                json.dump({"batches": batches, "errors": errors[:20], "checked": checked,
                           "files": sorted({shm_name(b) for b in kept} | set(sems))}, fh)
            os.replace(status + ".tmp", status)
        if os.path.exists(stop):
            break
'''

SECOND_LAB = '''
import json, os, sys, time
import labutils
CODE = """
import torch
from torch.utils.data import DataLoader, Dataset
class D(Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return torch.full((32,), float(i))
if __name__ == "__main__":
    total = sum(float(b[:, 0].sum()) for b in DataLoader(D(), batch_size=4, num_workers=2))
    import labutils
    labutils.emit(total=total)
"""
status, stop = sys.argv[1], sys.argv[2]
runs, bad = 0, []
while not os.path.exists(stop):
    r = labutils.run_isolated(CODE, start_method="spawn", timeout=120)
    runs += 1
    if not (r.ok and r.values.get("total") == float(sum(range(16)) * 1)):
        bad.append(f"run {runs}: {r.outcome} {r.cause} {r.stderr[-300:]}")
    with open(status + ".tmp", "w") as fh:
        json.dump({"runs": runs, "bad": bad[:10]}, fh)
    os.replace(status + ".tmp", status)
'''


class Neighbour:
    """A program started beside the lab, reporting through a status file, stopped through a stop file."""

    def __init__(self, name: str, source: str, workdir: str):
        self.name = name
        self.script = os.path.join(workdir, f"{name}.py")
        self.status = os.path.join(workdir, f"{name}.json")
        self.stop_file = os.path.join(workdir, f"{name}.stop")
        with open(self.script, "w", encoding="utf-8") as fh:
            fh.write(source)
        env = {k: v for k, v in os.environ.items() if k != "LABUTILS_RUN_DIR"}
        self.proc = subprocess.Popen([sys.executable, self.script, self.status, self.stop_file], env=env,
                                     stdout=subprocess.DEVNULL, stderr=open(self.status + ".err", "wb"))

    def report(self) -> dict:
        try:
            with open(self.status, encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return {}

    def wait_ready(self, key: str, timeout: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rep = self.report()
            if rep.get(key, 0) > 0:
                return rep
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} died at start: {self.stderr()}")
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not start within {timeout:g} s: {self.stderr()}")

    def stderr(self) -> str:
        try:
            with open(self.status + ".err", encoding="utf-8", errors="replace") as fh:
                return fh.read()[-2000:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 120.0) -> dict:
        with open(self.stop_file, "w"):
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        rep = self.report()
        rep["returncode"] = self.proc.returncode
        return rep


def crash_runs(n: int, progress: bool = False) -> tuple:
    """``n`` crash runs of the first lab; return (outcomes by kind, results)."""
    outcomes: dict = {}
    results = []
    for i in range(n):
        name, code, opts = RUNS[i % len(RUNS)]
        result = labutils.run_isolated(code, **{"timeout": 120, **opts})
        outcomes.setdefault(name, []).append(result.outcome)
        results.append(result)
        assert result.outcome in ("failed", "timed_out"), (name, result)
        if progress:
            print(f"\r{i + 1}/{n} {name:14s} {result.outcome:10s}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return outcomes, results


def left_by(results) -> list:
    """/dev/shm files of these runs that still exist (recorded semaphores, segments named after their pids)."""
    left = []
    for r in results:
        pids = {w.pid for w in r.workers} | {e["pid"] for e in r.events}
        left += [n for n in r.shm_created if os.path.exists("/dev/shm/" + n)]
        left += [n for n in labutils.leftover_shm() if n.startswith("torch_") and n.split("_")[1].isdigit()
                 and int(n.split("_")[1]) in pids]
        left += r.leftover_files
    return sorted(set(left))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--no-neighbours", action="store_true", help="the first lab alone")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="soak-neighbours-")
    # The first lab's run directories go to a folder of its own: other labs on the machine have theirs
    # in /tmp at the same time, so a global before/after count would count their runs in flight.
    tempfile.tempdir = tempfile.mkdtemp(prefix="soak-runs-")
    from labutils.runner.procs import start_ticks

    older = {(p, start_ticks(p)) for p in labutils.find_strays()}  # left before the soak, by someone else
    neighbours = []
    if not args.no_neighbours:
        neighbours = [Neighbour("bystander", BYSTANDER, workdir), Neighbour("second_lab", SECOND_LAB, workdir)]
        neighbours[0].wait_ready("batches")
        neighbours[1].wait_ready("runs", timeout=300)
    t0 = time.monotonic()
    try:
        outcomes, results = crash_runs(args.runs, progress=True)
    finally:
        reports = {nb.name: (nb.alive(), nb.stop()) for nb in neighbours}
    took = time.monotonic() - t0
    strays = [p for p in labutils.find_strays() if (p, start_ticks(p)) not in older]
    if older:
        print(f"stray processes found before the soak began (not its runs', not counted): "
              f"{sorted(p for p, _ in older)}")
    shm_left = left_by(results)
    tmp_left = sorted(glob.glob(os.path.join(tempfile.gettempdir(), "labutils-run-*")))
    if not tmp_left:
        os.rmdir(tempfile.gettempdir())
    print(f"{args.runs} crash runs in {took:.0f} s: " + ", ".join(f"{k} x{len(v)}" for k, v in outcomes.items()))
    print(f"stray processes: {len(strays)}  files of the runs left in /dev/shm: {len(shm_left)}  "
          f"temp dirs left: {len(tmp_left)}")
    ok = not (strays or shm_left or tmp_left)
    for name, (alive, rep) in reports.items():
        print(f"{name}: alive through the soak: {alive}, exit {rep.get('returncode')}, report "
              + json.dumps({k: v for k, v in rep.items() if k not in ("files", "returncode")}))
        ok = ok and alive and rep.get("returncode") == 0 and not rep.get("errors") and not rep.get("bad")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
