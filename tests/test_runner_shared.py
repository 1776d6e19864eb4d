"""A shared machine: a bystander program with its own spawn DataLoader (file_system strategy, so its own
named semaphores and /dev/shm/torch_* segments) loses nothing while the lab does crash runs beside it.
tests/tools/soak_leaks.py runs the long version (100 crash runs, and a second lab)."""

from __future__ import annotations

import sys

import pytest

import labutils

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/dev/shm and its sharing strategy are Linux's")


def test_a_bystander_loses_nothing_while_the_lab_crashes(tmp_path):
    from tools import soak_leaks

    bystander = soak_leaks.Neighbour("bystander", soak_leaks.BYSTANDER, str(tmp_path))
    try:
        before = bystander.wait_ready("batches")
        assert before["files"], "the bystander holds /dev/shm files of its own"
        outcomes, results = soak_leaks.crash_runs(len(soak_leaks.RUNS))  # SIGKILL, segfault, spawn, hang
        assert sorted(outcomes) == sorted(name for name, _, _ in soak_leaks.RUNS)
        assert bystander.alive(), bystander.stderr()
        mid = bystander.report()
    finally:
        report = bystander.stop()
    assert report["returncode"] == 0, bystander.stderr()
    assert report["errors"] == [], report["errors"]
    assert mid["batches"] > before["batches"], "the bystander kept loading during the crash runs"
    assert report["checked"] > before["checked"]
    assert soak_leaks.left_by(results) == []
    assert labutils.find_strays() == []
    # the runs removed only their own files: none of the bystander's is among them
    removed = {n for r in results for n in r.shm_removed}
    assert not removed & set(mid["files"])
