"""A run's record (the diagnosis's one reader of a RunResult) or a live exception as the facts the rules read
(:class:`.evidence._Facts`), with what only this machine adds: its kernel log (the OOM killer's record) and
whether its ``__main__`` can be imported by a spawned child. Apart from :mod:`.evidence` so that the worker-death
detector, which ``kit.fixes.ResilientLoader`` uses in the learner's process, loads without psutil.
"""

from __future__ import annotations

import os

from ..machine import probes
from ..runner import startmethod
from ..runner.result import ProcessInfo
from .chain import loader_iter
from .evidence import _chain_of, _Exc, _Facts, _Finding, plain_text, with_quoted

__all__ = ["facts_from_exception", "facts_from_result"]


def facts_from_result(result) -> _Facts:
    """The facts of a finished run, from its record."""
    facts = _Facts(source="run", outcome=result.outcome, returncode=result.returncode,
                   main_signal=result.signal, stderr=plain_text(result.stderr),
                   watchdog_kills=list(result.watchdog_kills), options=dict(result.options), reason=result.reason,
                   memory_limit=result.memory_limit, stall=result.stall, stacks=dict(result.stacks))
    facts.ended = with_quoted([_Exc(e.type, plain_text(e.message), plain_text(e.traceback), e.link, "ended")
                               for e in result.exceptions])
    events = result.loader_events
    for ev in events:
        kind = ev.get("event")
        if kind in ("error", "init_error") and ev.get("chain"):
            origin = "init" if kind == "init_error" else "next"
            chain = [_Exc(c.get("type", "?"), c.get("message", ""), c.get("traceback", ""), c.get("link"),
                          origin, ev.get("t")) for c in ev["chain"]]
            facts.loader_errors.append(chain)
    facts.iters = [ev for ev in events if ev.get("event") == "iter"]
    facts.raised = [ev["t"] for ev in events if ev.get("event") in ("error", "init_error", "sigchld_error")
                    and isinstance(ev.get("t"), (int, float))]
    progress = [ev for ev in events if ev.get("event") == "progress" and isinstance(ev.get("batches"), int)]
    per_iter: dict = {}
    for ev in progress:  # batches delivered so far by each iterator: the last count of each, summed
        per_iter[ev.get("iter")] = max(per_iter.get(ev.get("iter"), 0), ev["batches"])
    facts.batches = sum(per_iter.values()) if per_iter else None
    for ev in result.events:  # the monitor's record of each death, in order
        if isinstance(ev.get("t"), (int, float)):
            facts.ended_at.setdefault(ev.get("pid"), ev["t"])
        if ev.get("signal"):
            facts.exit_status[ev.get("pid")] = -ev["signal"]
        elif ev.get("exitcode") is not None:
            facts.exit_status.setdefault(ev.get("pid"), ev["exitcode"])
    facts.workers = list(result.workers)
    mine = {w.pid for w in result.workers}
    facts.other_loader_workers = len({ev.get("pid") for ev in result.events
                                      if ev.get("name") == "pt_data_worker" and ev.get("pid") not in mine})
    facts.env = dict(facts.options.get("env") or {})
    facts.kernel_record = probes.kernel_oom_record
    stamps = [e["t"] for e in [*events, *result.events] if isinstance(e.get("t"), (int, float))]
    if stamps:  # the first record of the run, less its start-up: no process of it is older
        facts.since = min(stamps) - (result.wall_time or 0.0) - 1.0
    batch_times = [ev["t"] for ev in progress if isinstance(ev.get("t"), (int, float))]
    facts.last_batch_t = max(batch_times) if batch_times else None
    ends = stamps + [x["t"] for x in result.samples if isinstance(x, dict) and isinstance(x.get("t"), (int, float))]
    facts.end_t = max(ends) if ends else None
    return facts


def facts_from_exception(exc: BaseException) -> _Facts:
    """The facts of a live exception: its chain, and the DataLoader iterator it came through, if any."""
    facts = _Facts(source="exception", outcome="failed", env=dict(os.environ), kernel_record=probes.kernel_oom_record)
    pairs = _chain_of(exc)
    facts.ended = [e for _, e in pairs]
    facts.notes.append("explained from the exception chain and this process's environment only: worker "
                       "stderr and the exit codes of workers that are gone are not available here "
                       "(run it with labutils.run_isolated or `python -m labutils diagnose` for those)")
    it = loader_iter([e for e, _ in pairs])
    if it is not None:
        workers = list(getattr(it, "_workers", []) or [])
        method = None
        for w in workers:
            try:
                code = w.exitcode
            except Exception:  # noqa: BLE001
                code = None
            facts.workers.append(ProcessInfo(getattr(w, "pid", None), role="dataloader_worker", exitcode=code))
            method = method or getattr(type(w), "_start_method", None)
        if workers and method is None:  # the default context: its Process class names no method
            method = startmethod.current()
        ds = facts.live_dataset = getattr(it, "_dataset", None)
        if (method in ("spawn", "forkserver") and type(ds).__module__ == "__main__"
                and not probes.main_importable() and any(w.exitcode == 1 for w in facts.workers)):
            facts.live_findings.append(_Finding(
                "main_not_importable", f"workers exited with code 1 at start-up under {method}, and the "
                f"dataset class {type(ds).__qualname__} lives in this __main__, which has no file to import "
                "it from", conf="medium"))
        facts.iters.append({"event": "iter", "num_workers": getattr(it, "_num_workers", None),
                            "timeout": getattr(it, "_timeout", None), "start_method": method,
                            "dataset": type(ds).__module__ + "." + type(ds).__qualname__ if ds is not None
                            else None})
    return facts
