"""labutils.kit.leftovers: what a finished run left behind, read from the runner's ledger of the run's own
/dev/shm files and from its workers' recorded endings."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

from labutils.kit import leftovers
from labutils.runner.result import ProcessInfo


def fake(created=(), removed=(), codes=()):
    workers = [ProcessInfo(pid=100 + k, role="dataloader_worker", exitcode=c) for k, c in enumerate(codes)]
    return SimpleNamespace(shm_created=list(created), shm_removed=list(removed), workers=workers,
                           dataloader_workers=workers)


def test_left_behind_reads_the_ledger_and_the_endings():
    assert leftovers.left_behind(fake(["sem.mp-a"], [], [0, 0])) == leftovers.NOTHING
    left = leftovers.left_behind(fake(["sem.mp-a", "torch_100_1_0"], ["torch_100_1_0", "not-in-ledger"], [0, None]))
    assert left == {"files": ["torch_100_1_0"], "unended_workers": [101]}
    runs = {"clean": fake(codes=[0]), "dirty": fake(["torch_100_1_0"], ["torch_100_1_0"], [-9])}
    assert leftovers.not_clean(runs) == {"dirty": {"files": ["torch_100_1_0"], "unended_workers": []}}


def test_torch_files_of_keeps_only_the_runs_own_pids():
    r = fake(["torch_100_5_0", "torch_7_5_0"], ["torch_100_5_0", "torch_7_5_0", "sem.mp-x"], [0])
    assert leftovers.torch_files_of(r) == ["torch_100_5_0"]


SCRIPT = """
import os, signal
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

if os.environ.get("LAB_KILL") == "1":
    mp.set_sharing_strategy("file_system")

if __name__ == "__main__":
    kept = list(DataLoader([torch.full((4,), float(i)) for i in range(20)], batch_size=2, num_workers=2,
                           multiprocessing_context="fork"))
    if os.environ.get("LAB_KILL") == "1":  # as a container stop: torch_shm_manager (its own session) too
        import psutil
        for p in psutil.process_iter(["name", "environ"]):
            if (p.info["name"] or "").startswith("torch_shm_manag") and \
                    (p.info["environ"] or {}).get("TMPDIR") == os.environ["TMPDIR"]:
                p.kill()
        os.killpg(os.getpgid(0), signal.SIGKILL)  # nobody left to unlink the file_system names
"""


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or not sys.platform.startswith("linux"),
                    reason="needs Linux and /dev/shm")
def test_a_real_clean_run_and_a_real_killed_one(no_leaks):
    import labutils

    clean = labutils.run_isolated(SCRIPT, timeout=60)
    assert clean.ok, clean
    assert leftovers.left_behind(clean) == leftovers.NOTHING
    killed = labutils.run_isolated(SCRIPT, timeout=60, env={"LAB_KILL": "1"})
    left = leftovers.left_behind(killed)
    assert len(left["files"]) >= 10, left  # one name per kept batch, never unlinked
    assert leftovers.torch_files_of(killed) == [n for n in left["files"] if n.startswith("torch_")]
