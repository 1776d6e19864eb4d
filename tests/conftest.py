"""Shared fixtures: every test must leave no process and no /dev/shm file of its runs behind."""

from __future__ import annotations

import os

import pytest


def shm_names() -> set:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(("torch_", "sem.mp-"))}
    except OSError:
        return set()


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves new torch_*/sem.mp-* files in /dev/shm or child processes alive."""
    import psutil

    before = shm_names()
    yield
    left = shm_names() - before
    assert not left, f"/dev/shm files left behind: {sorted(left)}"
    import labutils

    me = psutil.Process()
    helpers = ("resource_tracker", "forkserver")  # multiprocessing's own per-session helpers
    import gc

    gc.collect()  # a finished DataLoader iterator shuts its workers down when it is collected
    children = [p for p in me.children(recursive=True)
                if not any(h in " ".join(p.cmdline()) for h in helpers)]
    _gone, alive = psutil.wait_procs(children, timeout=10)  # workers get a moment to exit
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes left running: {[(p.pid, p.name()) for p in alive]}"
    assert labutils.find_strays() == [], "processes of finished isolated runs are still alive"
