"""DataLoader Crash Lab helpers: isolated runs, diagnosis, preflight checks and reusable fixes.

The public API, by job:

* run learner code isolated: :func:`run_isolated`, the ``%%isolate`` magic (``%load_ext labutils``),
  :func:`emit`, :class:`RunResult`; leak checks :func:`find_strays`, :func:`leftover_shm`;
* name the cause: :func:`explain` -> :class:`Diagnosis`;
* check the machine: :func:`doctor`, :func:`shm_budget`;
* find what blocks pickling: :func:`find_unpicklable`;
* reusable fixes: :mod:`labutils.kit.fixes`;
* the interactive lab: :func:`lab`.

Heavy or optional parts (torch, ipywidgets) are imported only when used, so that ``import labutils``
stays cheap inside an isolated run.
"""

import os
import sys

from . import lab
from .diagnosis.diagnose import Diagnosis, Fix, explain
from .diagnosis.pickling import Blocker, find_unpicklable, format_blockers
from .kit import measure, triage
from .kit.fixes import (
    LazyFile,
    PerWorkerResource,
    QuarantineDataset,
    QuarantineReport,
    ResilientLoader,
    Skipped,
    collate_skip,
    lazy_open,
    make_worker_init,
    worker_init_seed_and_faulthandler,
)
from .machine.doctor import CheckResult, DoctorReport, doctor, shm_budget
from .runner import startmethod
from .runner import startmethod as _startmethod
from .runner.channel import emit
from .runner.isolate import IsolationError, find_strays, leftover_shm, private_shm_support, run_isolated
from .runner.result import ExceptionInfo, ProcessInfo, RunResult
from .runner.spec import StopRun

__all__ = [
    "Blocker", "CheckResult", "Diagnosis", "DoctorReport", "ExceptionInfo", "Fix", "IsolationError",
    "LazyFile", "PerWorkerResource", "ProcessInfo", "QuarantineDataset", "QuarantineReport",
    "ResilientLoader", "RunResult", "Skipped", "StopRun", "collate_skip", "doctor", "emit", "explain", "find_strays",
    "find_unpicklable", "format_blockers", "lab", "lazy_open", "leftover_shm", "make_worker_init",
    "private_shm_support", "run_isolated", "shm_budget", "worker_init_seed_and_faulthandler",
    "measure", "startmethod", "triage",
]



def load_ipython_extension(ipython) -> None:
    """``%load_ext labutils`` registers the ``%%isolate`` cell magic (and applies the start-method switch)."""
    from .lab.magic import load_ipython_extension as _load

    _startmethod.apply_requested()
    _load(ipython)


def _in_notebook_kernel() -> bool:
    shell = sys.modules.get("IPython")
    try:
        return shell is not None and shell.get_ipython() is not None
    except Exception:  # noqa: BLE001 - an IPython in a strange state: not a kernel of the lab
        return False


def _started_by_a_run() -> bool:
    """Whether one of the lab's isolated runs started this interpreter (its environment names the runner),
    other than the run's own main process (and its forks), whose bootstrap has decided the start method."""
    from .runner.warm import RUNNER_ENV

    return bool(os.environ.get(RUNNER_ENV)) and not _startmethod.decided()


# The lab's start-method switch (LABUTILS_START_METHOD): a notebook kernel gets the same default as every
# run, and so does a process that a run starts with its own interpreter (torchrun's ranks, a script run with
# subprocess), as a newer Python would give them. The run's own main process gets it from its bootstrap,
# the lab's pytest plugin in its own process. A learner's script run outside the lab keeps Python's default.
if _in_notebook_kernel():
    _startmethod.apply_requested()
elif _started_by_a_run():  # a script as __main__, as in the run's own bootstrap: 3.14's fork server would preload it
    _startmethod.apply_requested(emulate_preload=True)
