"""Benchmark: ``diagnose --log`` on a generated 1 GB log against ``grep -cE 'Error|Killed'`` on the same file.

The log: tqdm progress lines (carriage-return rewrites) of four ranks with ``[rankN]:`` prefixes, an echo of a
worker's death (a ConnectionResetError in rebuild_storage_fd) in the middle, and the failure (a worker killed by
SIGSEGV) near the end. Both commands run side by side in this one run, grep first and then the diagnosis, each
twice (the second of each is reported, the file then in the page cache for both). The diagnosis runs as
``python -m labutils diagnose --log FILE --json`` in a child; its peak RSS is the child's ``ru_maxrss``.

    python tests/bench_log.py [--size-mb 1024] [--keep]

Targets (issue 30): at most 10x grep's time and at most 200 MB of memory; the right cause.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ECHO = """[rank1]: Traceback (most recent call last):
[rank1]:   File "/o/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1291, in _try_get_data
[rank1]:     data = self._data_queue.get(timeout=timeout)
[rank1]:   File "/o/lib/python3.11/site-packages/torch/multiprocessing/reductions.py", line 541, in rebuild_storage_fd
[rank1]:     fd = df.detach()
[rank1]: ConnectionResetError: [Errno 104] Connection reset by peer
"""
FAILURE = """[rank2]: Traceback (most recent call last):
[rank2]:   File "/work/train.py", line 88, in <module>
[rank2]:     for step, batch in enumerate(loader):
[rank2]:   File "/o/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1505, in _next_data
[rank2]:     idx, data = self._get_data()
[rank2]: RuntimeError: DataLoader worker (pid 48213) is killed by signal: Segmentation fault.
"""


def make_log(path: str, size: int) -> None:
    bar = "".join(f"\r[rank{{r}}]: Epoch {{e}}: {p:3d}%|{'#' * (p // 10):10s}| {p * 40}/4000 [03:{p % 60:02d}<01:12, "
                  f"11.2it/s, loss=0.{p:03d}]" for p in range(0, 100, 5)) + "\n"
    with open(path, "w", encoding="utf-8") as fh:
        written, k = 0, 0
        while written < size:
            chunk = "".join(bar.format(r=r, e=k) for r in range(4)) * 64
            if k == 1200:
                chunk += ECHO
            fh.write(chunk)
            written += len(chunk)
            k += 1
        fh.write(FAILURE + "[rank0]: epoch ended early\n" * 3)


def timed(cmd: list) -> tuple:
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    # KiB: the largest child so far; grep's is a few MiB, so after the diagnosis it is the diagnosis's
    return wall, out, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--keep", action="store_true", help="keep the generated log")
    args = p.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="bench-log-")
    path = os.path.join(folder, "job.log")
    t = time.perf_counter()
    make_log(path, args.size_mb << 20)
    print(f"generated {os.path.getsize(path) / 2**20:.0f} MiB in {time.perf_counter() - t:.1f} s: {path}")
    try:
        grep = [timed(["grep", "-cE", "Error|Killed", path])[0] for _ in range(2)]
        runs = [timed([sys.executable, "-m", "labutils", "diagnose", "--log", path, "--json"]) for _ in range(2)]
        wall, out, peak_kib = runs[-1]
        data = json.loads(out.stdout)
        ratio = wall / grep[-1]
        print(f"grep -cE 'Error|Killed': {grep[-1]:.2f} s; diagnose --log: {wall:.2f} s ({ratio:.1f}x grep), "
              f"peak RSS {peak_kib / 1024 if peak_kib else float('nan'):.0f} MiB; cause {data['cause']} "
              f"({data['confidence']})")
        ok = data["cause"] == "native_crash" and ratio <= 10 and (peak_kib or 0) / 1024 <= 200
        print("targets met" if ok else "targets NOT met")
        return 0 if ok else 1
    finally:
        if not args.keep:
            os.remove(path)
            os.rmdir(folder)


if __name__ == "__main__":
    sys.exit(main())
