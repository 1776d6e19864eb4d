"""Shared fixtures: every test must leave no process and no /dev/shm file of its runs behind."""

from __future__ import annotations

import json
import os

import pytest

pytest_plugins = ["pytester"]  # test_startmethod runs the lab's pytest plugin in a scratch project


def shm_names() -> set:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(("torch_", "sem.mp-"))}
    except OSError:
        return set()


_OWN_SEMAPHORES: set = set()  # named semaphores this test process created itself (in-process DataLoaders)


def _record_own_semaphores() -> None:
    from multiprocessing import synchronize

    original = synchronize.SemLock.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        name = getattr(getattr(self, "_semlock", None), "name", None)
        if name:
            _OWN_SEMAPHORES.add("sem." + name.lstrip("/"))

    synchronize.SemLock.__init__ = __init__


_record_own_semaphores()


def _ours(names: set, ledger: str, me) -> set:
    """Which of ``names`` this test made: recorded by one of its isolated runs (the ledger, written by every
    run below this process, in subprocesses too), a semaphore of this process, or a torch segment named
    after this process, a descendant of it, or a process of one of its runs. A neighbour's files on a shared
    /dev/shm (another test session, a helper's notebook) are not this test's to judge."""
    created, pids = set(), {me.pid}
    try:
        with open(ledger, encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                created.update(rec.get("created", []))
                pids.update(rec.get("pids", []))
    except (OSError, ValueError):
        pass
    try:
        pids.update(p.pid for p in me.children(recursive=True))
    except Exception:  # noqa: BLE001, S110
        pass
    out = set()
    for name in names:
        parts = name.split("_")
        if name in created or name in _OWN_SEMAPHORES:
            out.add(name)
        elif name.startswith("torch_") and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) in pids:
            out.add(name)
    return out


@pytest.fixture
def no_leaks(tmp_path, monkeypatch):
    """Fail the test if it leaves its own torch_*/sem.mp-* files in /dev/shm or child processes alive."""
    import psutil

    ledger = str(tmp_path / "shm-ledger.jsonl")
    monkeypatch.setenv("LABUTILS_SHM_LEDGER", ledger)
    before = shm_names()
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    me = psutil.Process()
    import time

    deadline = time.monotonic() + 6.0  # a run's resource_tracker / torch_shm_manager unlink on their own, late
    while True:
        left = _ours(shm_names() - before, ledger, me)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"/dev/shm files left behind: {sorted(left)}"
    import labutils

    helpers = ("resource_tracker", "forkserver", "runner/zygote.py")  # multiprocessing's helpers; the warm launcher
    import gc

    gc.collect()  # a finished DataLoader iterator shuts its workers down when it is collected
    children = [p for p in me.children(recursive=True)
                if not any(h in " ".join(p.cmdline()) for h in helpers) and p.pid not in children_before]
    _gone, alive = psutil.wait_procs(children, timeout=10)  # workers get a moment to exit
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes left running: {[(p.pid, p.name()) for p in alive]}"
    assert labutils.find_strays() == [], "processes of finished isolated runs are still alive"
