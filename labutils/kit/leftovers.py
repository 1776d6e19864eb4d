"""What a finished isolated run left behind, by identity: its own /dev/shm files, its own workers.

The runner's ledger holds the /dev/shm names that are a run's own (``RunResult.shm_created``: semaphores its
processes created, ``torch_<pid>_*`` segments of its verified pids) and the ones it removed at the run's end
(``shm_removed``). For a run whose processes all ended on their own, what was still there is what PyTorch and
multiprocessing failed to clean up. This is neither ``leftover_files`` (what the runner failed to delete) nor a
diff of the machine's /dev/shm (neighbours' files come and go there).
"""

from __future__ import annotations

from ..diagnosis.messages import EXIT_JOIN_RAISED
from ..runner.ownership import torch_segment_pid

#: :func:`left_behind` of a run that PyTorch and the OS cleaned up after.
NOTHING = {"files": [], "unended_workers": []}


def left_behind(run) -> dict:
    """``{"files": [...], "unended_workers": [...]}`` for one finished run: its own /dev/shm files still there
    when all its processes had ended (removed by the runner then, or not: ``leftover_files`` less the temporary
    folders), and the pids of :func:`unended` workers."""
    created = set(getattr(run, "shm_created", []) or [])
    removed = set(getattr(run, "shm_removed", []) or [])
    failed = {n for n in getattr(run, "leftover_files", []) or [] if "/" not in n}  # not the temp folders
    # the ledger's torch_ segments are the ones found at the run's end; its semaphores, every one created
    files = sorted({n for n in created if n.startswith("torch_")} | (removed & created) | failed)
    unended_pids = sorted(w.pid for w in unended(run, getattr(run, "dataloader_workers", None)))
    return {"files": files, "unended_workers": unended_pids}


def unended(run, workers=None) -> list:
    """``run``'s DataLoader workers (or ``workers``) with no recorded exit status: the runner had to kill them,
    or one ended after the main process unrecorded. None where PyTorch itself left them: its SIGCHLD handler
    raised inside multiprocessing's exit handler (:data:`~labutils.diagnosis.messages.EXIT_JOIN_RAISED` in the
    run's stderr), and the workers not yet joined outlive the main process under plain python too (the lab
    stops those still running: ``stopped_by_lab``)."""
    if workers is None:
        workers = [w for w in getattr(run, "workers", []) or [] if w.role == "dataloader_worker"]
    pytorch_left_them = EXIT_JOIN_RAISED.search(getattr(run, "stderr", "") or "") is not None
    return [] if pytorch_left_them else [w for w in workers if w.exitcode is None]


def not_clean(runs: dict) -> dict:
    """The runs of ``{name: run}`` that left something behind, with what (see :func:`left_behind`)."""
    found = {name: left_behind(run) for name, run in runs.items()}
    return {name: what for name, what in found.items() if what != NOTHING}


def torch_files_of(run) -> list:
    """The ``torch_<pid>_*`` names the runner removed for ``run`` whose pid is one of the run's processes."""
    pids = {w.pid for w in getattr(run, "workers", [])}
    return [n for n in getattr(run, "shm_removed", []) or [] if torch_segment_pid(n) in pids]
