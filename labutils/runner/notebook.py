"""Diagnose a notebook: execute it in a real Jupyter kernel inside an isolated run (the run's script is
``notebook_runner.py``), and make a RunResult of what the kernel recorded."""

from __future__ import annotations

import json
import os
from typing import Optional

from .isolate import run_isolated
from .result import ExceptionInfo, ProcessInfo, RunResult
from .spec import option

__all__ = ["run_notebook"]

#: the isolated run's script: a kernel, the notebook in it, its records emitted (run by path)
_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "notebook_runner.py")


def run_notebook(path: str, kw: dict, interval: float):
    """Execute the notebook in a Jupyter kernel inside an isolated run; a RunResult of the kernel's evidence."""
    start_method = option("start_method").check("start_method", kw.pop("start_method", None))  # the kernel's
    config = json.dumps({"path": os.path.abspath(path), "start_method": start_method})
    outer = run_isolated(file=_RUNNER, argv=[config], sample_interval=interval,
                         cwd=os.path.dirname(os.path.abspath(path)) or None, **kw)
    return _kernel_result(outer, path, start_method)


def _kernel_result(outer, path: str, start_method: Optional[str]):
    """A RunResult made of what the kernel recorded (its exception, loader events, workers), inside the
    outer run's limits, outcome and stderr (the kernel's and its workers' fd 2 go there)."""
    nb = (outer.values or {}).get("notebook")
    if outer.outcome == "unsupported" or not isinstance(nb, dict):
        # stopped before the runner could report (a stall, the time limit, the runner itself killed):
        # the run's own records stand, with the cell that was running
        outer.__dict__["failing_cell"] = (outer.values or {}).get("notebook_cell")
        return outer
    exits = {int(k): v for k, v in (nb.get("exits") or {}).items()}
    seen = {k["pid"] for k in outer.watchdog_kills or []}
    workers = []
    for rec in nb.get("procs") or []:
        pid = rec.get("pid")
        outer_info = next((w for w in outer.workers if w.pid == pid), None)
        workers.append(ProcessInfo(
            pid=pid, name=rec.get("name", ""),
            role="dataloader_worker" if str(rec.get("target", "")).endswith("_worker_loop") else "process",
            exitcode=exits.get(pid), killed_by_watchdog=pid in seen,
            peak_rss=outer_info.peak_rss if outer_info else None))
    chain = [ExceptionInfo(**{k: e.get(k) for k in ("type", "message", "module", "link", "traceback")
                              if k in e}) for e in nb.get("exc") or []]
    kernel_died = nb.get("kernel_died")
    if outer.outcome == "timed_out":
        outcome, rc = "timed_out", outer.returncode
    elif kernel_died:
        rc = nb.get("kernel_returncode")
        outcome = "failed"
    elif nb.get("error"):
        outcome, rc = "failed", 1
    elif outer.outcome != "ok":
        outcome, rc = outer.outcome, outer.returncode
    else:
        outcome, rc = "ok", 0
    main_kills = [k for k in outer.watchdog_kills or [] if k.get("pid") == nb.get("kernel_pid")]
    kills = [dict(k, main=True) if k in main_kills else k for k in outer.watchdog_kills or []]
    result = RunResult(
        outcome=outcome, returncode=rc, signal=-rc if isinstance(rc, int) and rc < 0 else None,
        workers=workers, exceptions=chain, loader_events=list(outer.loader_events or []),
        stdout=nb.get("stdout", "") or outer.stdout, stderr=(outer.stderr or "") + (nb.get("stderr") or ""),
        wall_time=outer.wall_time, peak_rss=outer.peak_rss, watchdog_kills=kills,
        reason=outer.reason or nb.get("error_text"), options=dict(outer.options, start_method=start_method,
                                                                  notebook=os.path.abspath(path)),
    )
    for name in ("memory_limit", "stall", "stacks"):
        if getattr(outer, name) is not None:
            setattr(result, name, getattr(outer, name))
    result.__dict__["failing_cell"] = nb.get("cell")
    return result
