"""The kernel's limits for one run, as one :class:`RunGroup`: a memory-limited cgroup (or systemd scope)
for ``memory_budget`` and a pids cgroup or RLIMIT_NPROC for ``max_processes``, made before the run and
removed after it, with what each one is (``result.memory_limit``, ``options["process_limit"]``)."""

from __future__ import annotations

from typing import Optional

from . import cgroup as _cgroup
from . import pids as _pids
from .sizes import format_size

WATCHDOG_MECHANISM = ("the lab's watchdog: every 50 ms it sums the PSS of the run's processes (a shared "
                      "page counted once, as the kernel charges it) and, over the limit, SIGKILLs the "
                      "process the kernel would pick (highest oom_score)")


class RunGroup:
    """The run's memory and process limits. ``refusal`` is set (and nothing is left made) when a limit
    that was asked for cannot be had here."""

    def __init__(self):
        self.memory: Optional[_cgroup.RunCgroup] = None
        self.pids: Optional[_cgroup.RunCgroup] = None
        self.nproc: Optional[int] = None
        self.memory_limit: Optional[dict] = None
        self.process_limit: Optional[dict] = None
        self.refusal: Optional[str] = None
        self.leftover: list = []

    @classmethod
    def prepare(cls, budget: Optional[int], enforcement: str, max_processes: Optional[int]) -> "RunGroup":
        group = cls()
        if budget is not None:
            group._memory(budget, enforcement)
        if max_processes is not None and group.refusal is None:
            group._processes(max_processes)
        if group.refusal is not None:
            group.remove()
        return group

    def _memory(self, budget: int, enforcement: str) -> None:
        reason = "memory_enforcement='watchdog' was asked for"
        if enforcement != "watchdog":
            self.memory, reason = _cgroup.prepare(budget)
        if self.memory is not None:
            self.memory_limit = {"enforced_by": "kernel", "limit": budget, "mechanism": self.memory.mechanism,
                                 "kernel_record": None}
        elif enforcement == "kernel":
            self.refusal = (f"memory_budget={format_size(budget)} with memory_enforcement='kernel': the kernel "
                            f"cannot enforce it here ({reason}); use 'auto' for the lab's watchdog")
        else:
            self.memory_limit = {"enforced_by": "watchdog", "limit": budget, "mechanism": WATCHDOG_MECHANISM,
                                 "kernel_record": None, "why_not_kernel": reason}

    def _processes(self, max_processes: int) -> None:
        plan, reason = _pids.prepare(max_processes)
        if plan is not None:
            self.pids, self.nproc = plan["group"], plan["nproc"]  # held at once: removed even when refused
        if plan is None or (self.pids is not None and self.memory is not None and self.memory.version == 2):
            reason = reason or "with memory_budget on cgroup v2 the run would need one group for both"
            self.refusal = (f"max_processes={max_processes}: no way to limit the run's processes here ({reason}); "
                            "run it as a user other than root (RLIMIT_NPROC), or where the lab may create a "
                            "child cgroup")
            return
        self.process_limit = {"limit": max_processes, "mechanism": plan["mechanism"], "refused": None}

    @property
    def prefix(self) -> list:
        return list(self.memory.prefix) if self.memory is not None else []

    @property
    def watchdog_budget(self) -> Optional[int]:
        """The budget the watchdog must enforce: all of it without a kernel limit, and under a systemd scope
        until the scope's ``memory.max`` has been read back (it may enforce nothing)."""
        ml = self.memory_limit
        if ml is None:
            return None
        if ml["enforced_by"] == "watchdog" or (self.memory is not None and not self.memory.verified):
            return ml["limit"]
        return None

    def config(self) -> dict:
        """What the bootstrap needs: the groups to join, the RLIMIT_NPROC to set."""
        cfg = {}
        if self.memory is not None and self.memory.procs_file:
            cfg["cgroup_procs"] = self.memory.procs_file
        if self.process_limit is not None:
            cfg.update(pids_procs=self.pids.procs_file if self.pids else None, nproc=self.nproc)
        return cfg

    def settle(self) -> None:
        """After the run: a systemd scope whose limit was never read back as set was not the kernel's."""
        m, ml = self.memory, self.memory_limit
        if m is None or ml is None or m.verified:
            return
        why = m.why or "the run's systemd scope was never found, so its memory.max could not be read back"
        ml.update(enforced_by="watchdog", mechanism=WATCHDOG_MECHANISM, why_not_kernel=why)

    def refused_forks(self) -> None:
        if self.pids is not None and self.process_limit is not None:
            self.process_limit["refused"] = _pids.refused(self.pids)

    def remove(self) -> list:
        """Remove the groups made for the run; return (and keep in ``leftover``) those that stayed."""
        for g in (self.memory, self.pids):
            if g is not None:
                error = g.remove()
                if error:
                    self.leftover.append(error)
        return self.leftover
