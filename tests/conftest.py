"""Shared fixtures: every test must leave no process and no /dev/shm file of its runs behind."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["pytester"]  # test_startmethod runs the lab's pytest plugin in a scratch project


def shm_names() -> set:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(("torch_", "sem.mp-"))}
    except OSError:
        return set()


def _foreign_segment(name: str, me) -> bool:
    """A torch segment made by a live process outside this test's process tree: a neighbour's, not a leak."""
    import psutil

    parts = name.split("_")
    if not (name.startswith("torch_") and len(parts) > 1 and parts[1].isdigit()):
        return False
    try:
        creator = psutil.Process(int(parts[1]))
        return creator.pid != me.pid and me.pid not in {p.pid for p in creator.parents()}
    except psutil.Error:
        return False  # its creator is gone: nobody will remove it


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves new torch_*/sem.mp-* files in /dev/shm or child processes alive."""
    import psutil

    before = shm_names()
    yield
    me = psutil.Process()
    import time

    deadline = time.monotonic() + 6.0  # a run's resource_tracker / torch_shm_manager unlink on their own, late
    while True:
        left = {n for n in shm_names() - before if not _foreign_segment(n, me)}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"/dev/shm files left behind: {sorted(left)}"
    import labutils

    helpers = ("resource_tracker", "forkserver", "_zygote.py")  # multiprocessing's helpers; the warm launcher
    import gc

    gc.collect()  # a finished DataLoader iterator shuts its workers down when it is collected
    children = [p for p in me.children(recursive=True)
                if not any(h in " ".join(p.cmdline()) for h in helpers)]
    _gone, alive = psutil.wait_procs(children, timeout=10)  # workers get a moment to exit
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes left running: {[(p.pid, p.name()) for p in alive]}"
    assert labutils.find_strays() == [], "processes of finished isolated runs are still alive"
