"""DataLoader Crash Lab helpers: isolated runs, diagnosis, preflight checks and reusable fixes."""

from .isolate import IsolationError, private_shm_support, run_isolated
from .result import ExceptionInfo, ProcessInfo, RunResult

__all__ = ["IsolationError", "ExceptionInfo", "ProcessInfo", "RunResult", "private_shm_support",
           "run_isolated"]
