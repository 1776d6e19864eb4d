"""Memory budgets that keep their margins on every build of torch.

The lab's budgets (notebook 04, ``oom_killed``) were sized with torch's CPU wheel, whose ``import torch``
costs a process about 146 MiB of anonymous memory; PyPI's CUDA wheel costs about 281 MiB (torch 2.13.0), in
*every* process that imports torch itself (the main one, each spawn or forkserver worker), so under spawn a
CPU-sized budget kills even a fixed loader. :func:`sized_budget` adds this machine's difference once per
such process; on the CPU wheel, and where the cost cannot be read (no ``/proc``), it adds nothing.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from typing import Optional, Union

from ..runner import startmethod
from ..runner.sizes import parse_size

__all__ = ["CPU_WHEEL_IMPORT_MIB", "extra_per_import_mib", "import_cost_mib", "own_imports", "sized_budget"]

MiB = 2**20

#: ``RssAnon`` after ``import torch``: torch 2.13.0+cpu, Python 3.11, Linux x86-64, measured 2026-12-04
CPU_WHEEL_IMPORT_MIB = 146

_PROBE = ("import torch\n"
          "for line in open('/proc/self/status'):\n"
          "    if line.startswith('RssAnon:'):\n"
          "        print(int(line.split()[1]) // 1024)\n")


@functools.lru_cache(maxsize=None)
def import_cost_mib() -> Optional[int]:
    """The anonymous memory (MiB) that a fresh ``import torch`` costs one process here, measured once in a
    new interpreter; None where it cannot be read (no ``/proc``) or the probe fails."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = done.stdout.strip()
    return int(out) if done.returncode == 0 and out.isdigit() else None


def extra_per_import_mib() -> int:
    """What this build's ``import torch`` costs a process beyond the CPU wheel's (MiB, at least 0)."""
    import torch

    if not torch.version.cuda and not getattr(torch.version, "hip", None):
        return 0  # a CPU build: what the budgets were sized with
    cost = import_cost_mib()
    return 0 if cost is None else max(0, cost - CPU_WHEEL_IMPORT_MIB)


def own_imports(start_method: str, workers: int) -> int:
    """The processes of a run that import torch themselves: the main one, and each worker unless forked."""
    return 1 if start_method == "fork" or workers <= 0 else 1 + workers


def sized_budget(budget: Union[str, int], start_method: Optional[str] = None, workers: int = 2) -> str:
    """``budget`` (sized on the CPU wheel) plus this build's extra import cost for each process that imports
    torch itself, as a size string (``"1159M"``). ``start_method`` None: what a run gets by default
    (``LABUTILS_START_METHOD``, else this Python's default)."""
    mib = -(-parse_size(budget) // MiB)
    method = start_method or startmethod.requested() or startmethod.python_default()
    return f"{mib + own_imports(method, workers) * extra_per_import_mib()}M"
