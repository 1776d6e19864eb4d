"""The isolated runner: each option really takes effect, and nothing of a run outlives it.

The machine is shared (other engineers' tests create /dev/shm files at the same moment), so leaks are
judged per run: ``own_leaks`` collects every RunResult a test makes and checks the files and processes
of those runs, not every new name in /dev/shm.
"""

from __future__ import annotations

import os
import resource
import sys
import textwrap
import time

import psutil
import pytest

import labutils
import labutils.runner.isolate as isolate
from labutils import IsolationError, run_isolated
from labutils.kit.caught import caught
from labutils.kit.deaths import check_death


def _run_pids(r) -> set:
    return {w.pid for w in r.workers} | {e["pid"] for e in r.events} | {k["pid"] for k in r.watchdog_kills}


@pytest.fixture(autouse=True)
def own_leaks(monkeypatch):
    """Fail a test whose runs leave a process or a /dev/shm file of theirs behind."""
    results = []
    real = isolate._execute

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        results.append(result)
        return result

    monkeypatch.setattr(isolate, "_execute", spy)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield results
    for r in results:
        assert r.leftover_files == [], r.leftover_files
        still = [n for n in r.shm_created if os.path.exists(os.path.join("/dev/shm", n))]
        assert still == [], f"files of the run still in /dev/shm: {still}"
        pids = _run_pids(r)
        segs = [n for n in labutils.leftover_shm() if n.startswith("torch_")
                and n.split("_")[1].isdigit() and int(n.split("_")[1]) in pids]
        assert segs == [], f"torch segments named after the run's processes: {segs}"
    me = psutil.Process()
    helpers = ("resource_tracker", "forkserver", "runner/zygote.py")  # zygote: the warm launcher of later runs
    children = [p for p in me.children(recursive=True) if not any(h in " ".join(p.cmdline()) for h in helpers)
                and p.pid not in before]  # not a worker an earlier test of this pytest process left
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
    assert labutils.find_strays() == [], "processes of finished isolated runs are still alive"

KILL_WORKER = textwrap.dedent("""
    import os, signal
    import torch
    from torch.utils.data import DataLoader, Dataset

    class D(Dataset):
        def __len__(self):
            return 16
        def __getitem__(self, i):
            if i == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            return torch.tensor(i)

    if __name__ == "__main__":
        for batch in DataLoader(D(), batch_size=2, num_workers=2):
            pass
""")


def test_ok_run_captures_stdout_and_values():
    r = run_isolated("import labutils\nprint('hello')\nlabutils.emit(n=3, xs=[1, 2])")
    assert r.outcome == "ok" and r.returncode == 0
    assert r.stdout.strip() == "hello"
    assert r.values == {"n": 3, "xs": [1, 2]}


def test_exception_chain_is_recorded():
    r = run_isolated("try:\n    1/0\nexcept ZeroDivisionError as e:\n    raise KeyError('k') from e")
    assert r.outcome == "failed" and r.returncode == 1
    assert [e.type for e in r.exceptions] == ["KeyError", "ZeroDivisionError"]
    assert r.exceptions[1].link == "cause"
    assert "ZeroDivisionError" in r.stderr


PERSISTENT_IN_A_GLOBAL = """
import time
started = time.monotonic()
import torch
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.tensor([i])


loader = DataLoader(Numbers(), batch_size=4, num_workers=2, persistent_workers=True,
                    multiprocessing_context="fork")
for epoch in range(2):
    seen = [b.tolist() for b in loader]
import labutils
labutils.emit(script_s=time.monotonic() - started, batches=len(seen))
"""


def test_a_persistent_loader_left_in_a_global_stops_its_workers_at_once():
    """The script's last line is its end: workers of a loader it kept are told to stop (exit 0), not left to
    PyTorch's 5 s join timeout per worker and a SIGTERM, as a garbage-collected cycle used to leave them."""
    r = run_isolated(PERSISTENT_IN_A_GLOBAL, timeout=60)
    assert r.ok and r.values["batches"] == 4, r.stderr
    workers = r.dataloader_workers
    assert len(workers) == 2 and all(w.exitcode == 0 and w.signal is None for w in workers), workers
    tail = r.wall_time - r.values["script_s"]  # from the script's last line to the end of the run
    assert tail < 4.0, f"the run ended {tail:.1f} s after the script's last line"


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_killed_worker_is_reported_with_its_signal(method):
    r = run_isolated(KILL_WORKER, start_method=method, timeout=60)
    assert r.outcome == "failed"
    workers = r.dataloader_workers
    assert len(workers) == 2
    killed = [w for w in workers if w.signal == 9]
    assert len(killed) == 1 and not killed[0].killed_by_watchdog
    # PyTorch's SIGCHLD handler names the signal: usually under the generic "exited unexpectedly", on its
    # own when it ran while the main process was inside a receive (CI, fork), and not at all when PyTorch's
    # status check saw the death first
    messages = [e.message for e in r.exceptions]
    assert r.exception.message.startswith("DataLoader worker (pid"), messages
    assert any("is killed by signal: Killed" in m for m in messages) or "exited unexpectedly" in messages[0], messages
    assert r.loader_events[0]["start_method"] == method
    assert r.loader_events[0]["num_workers"] == 2


def test_error_caught_by_script_is_still_recorded():
    loop = "    for batch in DataLoader(D(), batch_size=2, num_workers=2):\n        pass"
    assert loop in KILL_WORKER
    # what PyTorch raises is a race (labutils.kit.deaths): a RuntimeError from the SIGCHLD handler or the
    # status check, or a bare ConnectionResetError from fetching the batch the worker was handing over (seen
    # on Python 3.12 under load): the script catches any error, as a learner's `except Exception` would
    code = KILL_WORKER.replace(loop, "    try:\n        list(DataLoader(D(), batch_size=2, num_workers=2))\n"
                                     "    except Exception:\n        print('swallowed')")
    r = run_isolated(code, timeout=60)
    assert r.outcome == "ok" and "swallowed" in r.stdout, (r.outcome, r.stderr[-2000:])
    assert r.loader_errors, r.loader_events  # the lab recorded the error the script swallowed
    records = [{"type": e.type, "message": e.message} for e in r.loader_errors[0]]
    check_death(caught(r, records), signal=9)  # one of PyTorch's shapes, naming the worker that was killed


def test_nofile_is_seen_inside_the_run():
    r = run_isolated("import resource, labutils\nlabutils.emit(lim=resource.getrlimit(resource.RLIMIT_NOFILE)[0])",
                     nofile=64)
    assert r.values["lim"] == 64


HOG = "import time\nblocks = []\nwhile True:\n    blocks.append(bytearray(20 * 2**20))\n    time.sleep(0.01)"


def test_memory_budget_watchdog_sigkills_a_hog():
    r = run_isolated(HOG, memory_budget="200M", timeout=60, memory_enforcement="watchdog")
    assert r.outcome == "failed" and r.signal == 9
    assert r.memory_limit["enforced_by"] == "watchdog" and r.memory_limit["kernel_record"] is None
    assert r.watchdog_kills and r.watchdog_kills[0]["main"]
    assert r.watchdog_kills[0]["charged"] > 200 * 2**20
    assert "watchdog" in str(r)


def test_memory_budget_kernel_oom_kills_a_hog():
    r = run_isolated(HOG, memory_budget="200M", timeout=60)
    if r.memory_limit["enforced_by"] != "kernel":
        pytest.skip(f"no memory cgroup for a run here: {r.memory_limit.get('why_not_kernel')}")
    assert r.outcome == "failed" and r.signal == 9
    record = r.memory_limit["kernel_record"]
    assert record["oom_kill"] >= 1  # the kernel's own counter for the run's group
    assert record["main_killed"] and r.watchdog_kills == []
    assert "enforced by the kernel" in str(r)


def test_timeout_kills_the_whole_group_in_time():
    code = textwrap.dedent("""
        import multiprocessing as mp, time
        def sleeper():
            time.sleep(600)
        if __name__ == "__main__":
            procs = [mp.Process(target=sleeper) for _ in range(2)]
            for p in procs:
                p.start()
            time.sleep(600)
    """)
    t0 = time.monotonic()
    r = run_isolated(code, timeout=3)
    assert time.monotonic() - t0 < 3 + 2
    assert r.outcome == "timed_out" and "3 s" in r.reason
    assert len(r.workers) == 2
    assert r.stray_processes == []
    assert "lab_cell.py\", line 9" in r.stderr  # faulthandler dump: the main was stuck on line 9


def test_shm_size_gives_a_private_dev_shm_or_says_unsupported():
    r = run_isolated("import os, labutils\ns = os.statvfs('/dev/shm')\nlabutils.emit(size=s.f_blocks * s.f_frsize)",
                     shm_size="8M")
    if r.outcome == "unsupported":
        assert "shm_size" in r.reason and r.returncode is None
        pytest.skip(f"private /dev/shm not allowed here: {r.reason}")
    assert r.outcome == "ok"
    assert r.values["size"] == 8 * 2**20
    assert os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize != 8 * 2**20


def test_env_and_argv_reach_the_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os, sys, labutils\nlabutils.emit(v=os.environ['LAB_X'], argv=sys.argv[1:])\n")
    r = run_isolated(file=script, argv=["--epochs", "2"], env={"LAB_X": "42"})
    assert r.values == {"v": "42", "argv": ["--epochs", "2"]}


def test_notebook_main_hides_main_from_spawn_children():
    code = textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, Dataset
        class D(Dataset):
            def __len__(self):
                return 4
            def __getitem__(self, i):
                return i
        for b in DataLoader(D(), num_workers=1):
            pass
    """)
    r = run_isolated(code, notebook_main=True, start_method="spawn", timeout=60)
    assert r.outcome == "failed"
    assert "Can't get attribute 'D' on <module '__main__'" in r.stderr


MAIN_CLASS_BATCHES = textwrap.dedent("""
    import sys

    from torch.utils.data import DataLoader

    import labutils


    class Batch(list):  # defined in the script: spawn and forkserver workers pickle it as __mp_main__.Batch
        pass


    if __name__ == "__main__":
        got = [(type(b).__name__, list(b)) for b in DataLoader(list(range(6)), batch_size=3, num_workers=2,
                                                                  collate_fn=Batch)]
        labutils.emit(got=got, mp_main_is_main=sys.modules["__mp_main__"] is sys.modules["__main__"])
""")


@pytest.mark.parametrize("launcher", ["cold", "warm"])
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_script_gets_back_objects_of_its_own_classes_from_workers(tmp_path, method, launcher):
    # as under `python script.py`: the parent unpickles the worker's __mp_main__.Batch (before the script ran
    # as __main__ and __mp_main__ still named the bootstrap: "Can't get attribute 'Batch' on <module
    # '__main__' from .../bootstrap.py>", raised where plain python raises nothing)
    script = tmp_path / "own_class.py"
    script.write_text(MAIN_CLASS_BATCHES)
    r = run_isolated(file=script, start_method=method, launcher=launcher, timeout=90)
    assert r.ok, (r.cause, r.stderr[-2000:])
    assert r.values == {"got": [["Batch", [0, 1, 2]], ["Batch", [3, 4, 5]]], "mp_main_is_main": True}, r.values
    assert r.loader_events[0]["start_method"] == method


def test_func_mode_returns_value(tmp_path, monkeypatch):
    (tmp_path / "labmod_demo.py").write_text("def f(a, b=1):\n    return {'sum': a + b}\n")
    monkeypatch.chdir(tmp_path)
    r = run_isolated(func="labmod_demo:f", args=[2], kwargs={"b": 5})
    assert r.outcome == "ok" and r.value == {"sum": 7}


@pytest.mark.parametrize("kwargs, words", [
    ({}, "exactly one"),
    ({"code": "pass", "start_method": "thread"}, "start_method"),
    ({"code": "pass", "timeout": -1}, "timeout"),
    ({"code": "pass", "nofile": 3}, "nofile"),
    ({"code": "pass", "max_processes": 1}, "max_processes"),
    ({"code": "pass", "memory_budget": "lots"}, "lots"),
    ({"file": "/no/such/script.py"}, "does not exist"),
    ({"func": lambda: 1}, "module-level"),
])
def test_bad_input_gets_a_clear_message(kwargs, words):
    with pytest.raises((IsolationError, ValueError), match=words):
        run_isolated(**kwargs)


def test_mixed_crash_runs_leave_nothing_behind():
    """A short soak (tests/tools/soak_leaks.py runs the long one): SIGKILL, segfault, timeout, spawn."""
    segv = KILL_WORKER.replace("os.kill(os.getpid(), signal.SIGKILL)", "import ctypes; ctypes.string_at(0)")
    runs = [(KILL_WORKER, {}), (segv, {}), (KILL_WORKER, {"start_method": "spawn"}),
            ("import time\ntime.sleep(60)", {"timeout": 1})]
    for code, opts in runs:
        r = run_isolated(code, **{"timeout": 60, **opts})
        assert r.outcome in ("failed", "timed_out")
        assert r.stray_processes == []
    assert labutils.find_strays() == []


@pytest.mark.skipif(sys.platform != "linux", reason="/dev/shm segments are a Linux feature")
def test_shm_segments_of_a_killed_run_are_removed():
    # A run killed while it holds shared-memory tensors (file_system strategy keeps names in /dev/shm).
    code = textwrap.dedent("""
        import os, time, torch, torch.multiprocessing as mp
        import labutils
        mp.set_sharing_strategy("file_system")
        keep = [torch.ones(1000).share_memory_() for _ in range(3)]
        labutils.emit(segs=sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"torch_{os.getpid()}_")))
        time.sleep(60)
    """)
    r = run_isolated(code, timeout=8)
    assert r.outcome == "timed_out"
    segs = r.values["segs"]
    assert len(segs) >= 3, segs  # what torch created, seen from inside the run
    assert [n for n in segs if os.path.exists(os.path.join("/dev/shm", n))] == []


def test_a_listener_that_raises_stoprun_ends_the_run_at_once():
    """Notebook 10's as-written recipe only waits once its workers are dead: its cell stops it there."""
    code = textwrap.dedent("""
        import multiprocessing as mp, os, time

        def child():  # lives a second: the monitor reports the deaths of processes it has seen
            time.sleep(1)
            os._exit(3)

        if __name__ == "__main__":
            child = mp.get_context("fork").Process(target=child)
            child.start()
            time.sleep(60)  # what the recipe does after its workers died: it waits
    """)
    seen = []

    def on_event(event):
        seen.append(event)
        if event["exitcode"] == 3:
            raise labutils.StopRun("the child exited 3")

    t0 = time.monotonic()
    r = run_isolated(code, timeout=120, on_event=on_event)
    assert time.monotonic() - t0 < 30, "the run went on after the listener asked it to stop"
    assert r.outcome == "timed_out" and r.reason.startswith("stopped on request: the child exited 3"), r.reason
    assert [e["exitcode"] for e in seen if e["role"] != "main"] == [3], seen
    assert r.monitor_errors == [] and r.stray_processes == []


def test_a_listener_that_fails_does_not_stop_the_run():
    def broken(event):
        raise KeyError("a bug in the listener")

    r = run_isolated("import multiprocessing as mp, os\nif __name__ == '__main__':\n"
                     "    p = mp.get_context('fork').Process(target=os._exit, args=(0,)); p.start(); p.join()\n",
                     timeout=60, on_event=broken)
    assert r.ok and any("a bug in the listener" in e for e in r.monitor_errors), r.monitor_errors


def test_the_monitor_survives_a_bad_tick_and_says_so(monkeypatch):
    from labutils.runner import monitor

    real, calls = monitor._rss, []

    def flaky(pid):
        calls.append(pid)
        if len(calls) == 1:
            raise RuntimeError("a bad tick")
        return real(pid)

    monkeypatch.setattr(monitor, "_rss", flaky)
    r = run_isolated("import time\ntime.sleep(1)\n", timeout=30)
    assert r.ok and any("a bad tick" in e for e in r.monitor_errors), r.monitor_errors
    assert r.peak_rss  # later ticks still measured the run


def test_a_watchdog_that_cannot_watch_stops_the_run(monkeypatch):
    from labutils.runner import monitor

    def broken(pid):
        raise RuntimeError("no /proc")

    monkeypatch.setattr(monitor, "_rss", broken)
    r = run_isolated("import time\ntime.sleep(60)\n", timeout=60, memory_budget="300M",
                     memory_enforcement="watchdog")
    assert r.outcome == "failed" and "could not watch" in r.reason and r.wall_time < 30


def test_runs_work_in_a_process_holding_more_than_1024_fds():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("the hard limit on open files is below 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while len(held) < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        r = run_isolated("import time\ntime.sleep(0.3)\nprint('fine')\n", timeout=30)
        assert r.ok and r.stdout.strip() == "fine", (r.outcome, r.stderr)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _open_fds() -> set:
    return set(os.listdir("/proc/self/fd"))


def test_a_run_whose_interpreter_cannot_start_leaves_no_fd(tmp_path):
    fake = tmp_path / "python"
    fake.write_bytes(b"\x7fELF not really an interpreter\n")
    fake.chmod(0o755)
    before = _open_fds()
    for _ in range(3):
        with pytest.raises(IsolationError, match="could not start the run's Python"):
            run_isolated("pass", python=str(fake), timeout=30)
    assert _open_fds() <= before, _open_fds() - before


def test_an_interrupt_during_a_run_leaves_no_fd_and_no_process(monkeypatch):
    import psutil

    from labutils.runner import isolate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    for launcher in ("auto", "cold"):
        run_isolated("pass", launcher=launcher, timeout=60)  # the template (warm) exists before counting
        before = _open_fds()
        kids = {p.pid for p in psutil.Process().children()}
        with monkeypatch.context() as m:
            m.setattr(isolate, "_wait_leader", interrupted)
            with pytest.raises(KeyboardInterrupt):
                run_isolated("import time\ntime.sleep(30)", launcher=launcher, memory_budget=None, timeout=60)
        assert _open_fds() <= before, (launcher, _open_fds() - before)
        left = [p for p in psutil.Process().children() if p.pid not in kids and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, (launcher, left)
