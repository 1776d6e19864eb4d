"""Isolated torchrun launches: ``python -m torch.distributed.run`` as one run of the lab.

:func:`run_torchrun` runs ``torch.distributed.run.main([...])`` (the engine behind the ``torchrun``
command) inside :func:`labutils.run_isolated`, so the launcher, every rank and every rank's DataLoader
workers are processes of that one run: the run's time limit covers them all, and nothing of the launch is
left running afterwards. The rendezvous is local (``--standalone``: a c10d store on a free port of this
machine), so nothing leaves the host.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence

from .isolate import IsolationError, run_isolated

__all__ = ["run_torchrun", "torchrun_argv"]


def torchrun_argv(script: str, script_args: Sequence[str] = (), *, nproc_per_node: int = 2,
                  max_restarts: int = 0, extra: Sequence[str] = ()) -> list:
    """The argument list of ``torchrun --standalone --nproc-per-node N [--max-restarts K] SCRIPT ARGS``."""
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node={nproc_per_node!r}: give a whole number of ranks, at least 1")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts={max_restarts!r}: give a whole number, 0 or more")
    argv = ["--standalone", "--nproc-per-node", str(nproc_per_node), "--max-restarts", str(max_restarts),
            "--monitor-interval", "0.1", *extra, os.fspath(script), *map(str, script_args)]
    return argv


def run_torchrun(script: str, script_args: Sequence[str] = (), *, nproc_per_node: int = 2,
                 max_restarts: int = 0, extra: Sequence[str] = (), timeout: Optional[float] = 120.0,
                 env: Optional[Mapping[str, str]] = None, **kwargs: Any):
    """Launch ``script`` with torchrun (CPU, local rendezvous) as one isolated run; return its RunResult.

    ``nproc_per_node`` ranks are started on this machine; ``max_restarts`` is torchrun's
    ``--max-restarts`` (a failed attempt stops every rank and starts them all again); ``extra`` are more
    torchrun options, before the script. Other keyword arguments go to :func:`labutils.run_isolated`
    (``memory_budget``, ``shm_size``, ``start_method``, ``on_sample``, ...).
    """
    path = os.path.abspath(os.fspath(script))
    if not os.path.isfile(path):
        raise IsolationError(f"script={os.fspath(script)!r}: does not exist; check the path")
    try:
        argv = torchrun_argv(path, script_args, nproc_per_node=nproc_per_node, max_restarts=max_restarts,
                             extra=extra)
    except ValueError as exc:
        raise IsolationError(str(exc)) from None
    run_env = {"OMP_NUM_THREADS": "1", **dict(env or {})}  # what torchrun sets anyway, without its banner
    return run_isolated(func="torch.distributed.run:main", args=[argv], timeout=timeout, env=run_env,
                        cwd=kwargs.pop("cwd", os.path.dirname(path)), **kwargs)
