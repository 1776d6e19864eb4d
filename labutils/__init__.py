"""DataLoader Crash Lab helpers: isolated runs, diagnosis, preflight checks and reusable fixes."""

from .channel import emit
from .isolate import IsolationError, find_strays, leftover_shm, private_shm_support, run_isolated
from .result import ExceptionInfo, ProcessInfo, RunResult

__all__ = ["emit", "IsolationError", "find_strays", "leftover_shm", "ExceptionInfo", "ProcessInfo", "RunResult", "private_shm_support",
           "run_isolated"]


def load_ipython_extension(ipython) -> None:
    """``%load_ext labutils`` registers the ``%%isolate`` cell magic."""
    from .magic import load_ipython_extension as _load

    _load(ipython)
