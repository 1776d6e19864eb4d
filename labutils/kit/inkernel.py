"""A DataLoader's failure caught in this kernel (notebook 08's trap), recorded in the shape
:mod:`labutils.kit.deaths` reads, so that ``check_death(kernel_run(exc), exitcode=1)`` checks it as it checks
an isolated run's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..diagnosis.chain import links, loader_iter
from ..runner.result import ExceptionInfo, ProcessInfo


@dataclass
class KernelRun:
    """The evidence of one loader failure in this kernel (the fields ``check_death`` reads)."""

    exceptions: list = field(default_factory=list)  # ExceptionInfo, outermost first
    workers: list = field(default_factory=list)  # ProcessInfo of the iterator's workers
    loader_events: list = field(default_factory=list)  # one {"event": "iter", ...} record

    @property
    def dataloader_workers(self) -> list:
        return [w for w in self.workers if w.role == "dataloader_worker"]

    @property
    def all_messages(self) -> str:
        return "\n".join(str(e) for e in self.exceptions)


def kernel_run(exc: BaseException) -> KernelRun:
    """Record ``exc`` (raised by a DataLoader in this process) and the workers of its iterator.

    Call it inside the ``except`` block: the iterator, and with it the workers' pids and exit codes, is
    found through the traceback's frames.
    """
    import multiprocessing

    pairs = links(exc)
    record = KernelRun(exceptions=[ExceptionInfo(type(e).__name__, str(e), type(e).__module__, link)
                                   for e, link in pairs])
    it = loader_iter([e for e, _ in pairs])
    if it is None:
        return record
    method = None
    for w in list(getattr(it, "_workers", []) or []):
        try:
            code = w.exitcode
        except Exception:  # noqa: BLE001 - a worker object in an odd state: no exit code known
            code = None
        record.workers.append(ProcessInfo(pid=w.pid, name="pt_data_worker", role="dataloader_worker",
                                          exitcode=code))
        method = method or getattr(type(w), "_start_method", None)
    record.loader_events.append({"event": "iter", "num_workers": len(record.workers),
                                 "start_method": method or multiprocessing.get_start_method()})
    return record
