"""The diagnosis judges a message by where it was raised: rules on hand-built RunResults.

Each test builds the evidence a real run leaves (tracebacks with their frames, loader events, worker
exit statuses, the runner's memory_limit/stall records) and checks cause, confidence and summary.
"""

from __future__ import annotations

import pytest

from labutils.diagnosis.causes import CATALOGUE, CAUSES, LOADER_CAUSES, PRECEDENCE, cheatsheet_rows, fixes_for
from labutils.diagnosis.diagnose import explain, is_worker_death, worker_death_kind
from labutils.machine import probes
from labutils.runner.result import ExceptionInfo, ProcessInfo, RunResult

SITE = "/venv/lib/python3.11/site-packages"
LIB = "/usr/lib/python3.11"
ITER = {"event": "iter", "t": 1.0, "iter": 1, "num_workers": 2, "timeout": 0, "start_method": "fork",
        "batch_size": 4}


def frames(*specs) -> str:
    """Traceback text from (path, function) pairs, outermost first."""
    out = "Traceback (most recent call last):\n"
    for path, func in specs:
        out += f'  File "{path}", line 10, in {func}\n    pass\n'
    return out


USER = ("/home/u/train.py", "<module>")
NEXT = (f"{SITE}/torch/utils/data/dataloader.py", "__next__")
ITER_F = (f"{SITE}/torch/utils/data/dataloader.py", "__iter__")


def workers(*codes, **kw):
    return [ProcessInfo(pid=100 + i, role="dataloader_worker", exitcode=c, **kw) for i, c in enumerate(codes)]


def run(outcome="failed", returncode=1, events=(), **kw):
    r = RunResult(outcome=outcome, returncode=returncode,
                  signal=-returncode if returncode is not None and returncode < 0 else None,
                  loader_events=[ITER, *events], **kw)
    return r


def chain_event(kind, *excs, t=2.0):
    return {"event": kind, "t": t, "chain": [dict(type=e.type, message=e.message, module="builtins",
                                                  link=e.link, traceback=e.traceback) for e in excs]}


def died(pid=100, why=None):
    outer = ExceptionInfo("RuntimeError", f"DataLoader worker (pid(s) {pid}) exited unexpectedly",
                          traceback=frames(USER, NEXT))
    chain = [outer]
    if why:
        chain.append(ExceptionInfo("RuntimeError", why, link="cause", traceback=frames(
            (f"{SITE}/torch/utils/data/_utils/signal_handling.py", "handler"))))
    return chain


# --------------------------------------------------------------------------- the catalogue
def test_catalogue_has_every_cause_with_fixes_and_a_notebook():
    assert len(CAUSES) == 15 and CAUSES[0] == "ok" and "outside_loader" in CAUSES
    assert "outside_loader" not in LOADER_CAUSES and "ok" not in LOADER_CAUSES
    for cause in CAUSES[1:]:
        assert cause in PRECEDENCE
        fixes = fixes_for(cause)
        assert fixes and all(f.path.startswith("notebooks/") for f in fixes), cause
        assert CATALOGUE[cause].summary and CATALOGUE[cause].title
    assert fixes_for("fd_limit", "user_leak")[0].text != fixes_for("fd_limit")[0].text
    rows = cheatsheet_rows()
    # the TAUGHT rows may also name echoes, warnings and ok
    assert {r[1] for r in rows if r[1] in CAUSES[1:]} == set(CAUSES[1:])


# --------------------------------------------------------------------------- outside the loader
@pytest.mark.parametrize("exc", [
    ExceptionInfo("PicklingError", "Can't pickle <function <lambda> at 0x7f>: attribute lookup <lambda> on "
                  "__main__ failed", traceback=frames(USER, (f"{SITE}/torch/serialization.py", "save"),
                                                       (f"{SITE}/torch/serialization.py", "_save"))),
    ExceptionInfo("AttributeError", "Can't get attribute 'Net' on <module '__main__' from '/home/u/eval.py'>",
                  traceback=frames(USER, (f"{SITE}/torch/serialization.py", "load"),
                                   (f"{SITE}/torch/serialization.py", "find_class"))),
    ExceptionInfo("TypeError", "cannot pickle '_thread.lock' object", traceback=frames(USER, ("/home/u/cache.py",
                                                                                              "store"))),
    ExceptionInfo("AssertionError", "Torch not compiled with CUDA enabled",
                  traceback=frames(USER, (f"{SITE}/torch/cuda/__init__.py", "_lazy_init"))),
    ExceptionInfo("RuntimeError", "DataLoader worker (pid(s) 5) exited unexpectedly (quoted by the user)",
                  traceback=frames(USER, ("/home/u/train.py", "check"))),
])
def test_errors_raised_outside_the_loader_are_outside_loader(exc):
    d = explain(run(exceptions=[exc], workers=workers(0, 0),
                    events=[{"event": "progress", "t": 1.5, "iter": 1, "batches": 7}]))
    assert d.cause == "outside_loader" and d.confidence == "high", d
    assert "not to blame" in d.summary and exc.type in d.summary
    assert any("7 batches" in e for e in d.evidence)


def test_the_error_that_ended_the_run_outranks_an_early_caught_one():
    caught = ExceptionInfo("KeyError", "Caught KeyError in DataLoader worker process 0.\nOriginal Traceback "
                           "(most recent call last):\nKeyError: 'x'", traceback=frames(USER, NEXT))
    ended = ExceptionInfo("RuntimeError", "mat1 and mat2 shapes cannot be multiplied",
                          traceback=frames(USER, (f"{SITE}/torch/nn/modules/linear.py", "forward")))
    d = explain(run(exceptions=[ended], workers=workers(0, 0), events=[chain_event("error", caught)]))
    assert d.cause == "outside_loader"
    assert any(e.startswith("also seen") and "KeyError" in e for e in d.evidence)


def test_user_exception_raised_from_a_loader_death_is_the_death():
    wrapper = ExceptionInfo("RuntimeError", "training failed", traceback=frames(USER, ("/home/u/train.py", "fit")))
    chain = [wrapper] + [ExceptionInfo(e.type, e.message, link="cause", traceback=e.traceback) for e in died(
        100, "DataLoader worker (pid 100) is killed by signal: Segmentation fault.")]
    d = explain(run(exceptions=chain, workers=workers(-11, 0)))
    assert d.cause == "native_crash"


def test_stopiteration_context_does_not_make_a_user_error_a_loader_error():
    ended = ExceptionInfo("ValueError", "empty epoch", traceback=frames(USER))
    ctx = ExceptionInfo("StopIteration", "", link="context", traceback=frames(USER, NEXT))
    d = explain(run(exceptions=[ended, ctx], workers=workers(0, 0)))
    assert d.cause == "outside_loader"


# --------------------------------------------------------------------------- stderr never decides alone
def test_a_healthy_run_is_ok_whatever_its_stderr_says():
    stderr = (f"{SITE}/torch/cuda/__init__.py:129: UserWarning: CUDA initialization: Unexpected error from "
              "cudaGetDeviceCount()\nERROR: Unexpected segmentation fault encountered in worker.\n"
              "RuntimeError: DataLoader worker (pid(s) 1) exited unexpectedly\nOSError: [Errno 24] Too many "
              "open files\n" + frames(("/home/u/log.py", "show")) + "RuntimeError: CUDA error: no kernel\n")
    d = explain(run(outcome="ok", returncode=0, workers=workers(0, 0), stderr=stderr))
    assert d.cause == "ok" and d.confidence == "high"


# --------------------------------------------------------------------------- echoes
def test_echoes_are_labelled_and_the_primary_failure_first():
    pin = ExceptionInfo("RuntimeError", "Pin memory thread exited unexpectedly", link="context",
                        traceback=frames(USER, NEXT))
    chain = died(100, "DataLoader worker (pid 100) is killed by signal: Bus error. It is possible that "
                 "dataloader's workers are out of shared memory.") + [pin]
    d = explain(run(exceptions=chain, workers=workers(-7, 0), options={"shm_size": 8 << 20}))
    assert d.cause == "shm_exhausted"
    assert sum(e.startswith("echo of the failure above") for e in d.evidence) == 2, d.evidence
    assert not d.evidence[0].startswith("echo")


@pytest.mark.parametrize("exc, kind", [
    (ExceptionInfo("ConnectionResetError", "[Errno 104] Connection reset by peer",
                   traceback=frames(USER, NEXT, (f"{SITE}/torch/multiprocessing/reductions.py", "rebuild_storage_fd"),
                                    (f"{LIB}/multiprocessing/resource_sharer.py", "detach"))), "race"),
    (ExceptionInfo("EOFError", "", traceback=frames(USER, NEXT, (f"{LIB}/multiprocessing/reduction.py", "recvfds"))),
     "race"),
    (ExceptionInfo("FileNotFoundError", "[Errno 2] No such file or directory",
                   traceback=frames(USER, NEXT, (f"{SITE}/torch/multiprocessing/reductions.py",
                                                 "rebuild_storage_fd"))), "race"),
    (ExceptionInfo("FileNotFoundError", "[Errno 2] No such file or directory: 'a.png'",
                   traceback=frames(USER, ("/home/u/data.py", "__getitem__"))), None),
])
def test_death_echoes_from_the_fetch_race(exc, kind):
    from labutils.diagnosis.evidence import _Exc

    assert worker_death_kind(_Exc(exc.type, exc.message, exc.traceback)) == kind
    if kind:
        d = explain(run(exceptions=[exc], workers=workers(3, 0)))
        assert d.cause == "worker_exit" and any("echo" in e for e in d.evidence)


def test_live_detector_is_the_one_fixes_uses():
    from labutils.kit import fixes

    outer = RuntimeError("DataLoader worker (pid(s) 7) exited unexpectedly")
    assert is_worker_death(outer) and fixes.is_worker_death(outer)
    assert not fixes.is_worker_death(RuntimeError("Pin memory thread exited unexpectedly"))


# --------------------------------------------------------------------------- who killed the worker
def test_sigkill_without_memory_evidence_is_low_confidence_and_names_other_senders(monkeypatch):
    monkeypatch.setattr(probes, "kernel_oom_record", lambda pids: None)
    d = explain(run(exceptions=died(100, "DataLoader worker (pid 100) is killed by signal: Killed."),
                    workers=workers(-9, 0)))
    assert d.cause == "oom_killed" and d.confidence == "low"
    assert "kill -9" in d.summary and "scheduler" in d.summary
    assert any("dmesg" in f.text for f in d.fixes)


@pytest.mark.parametrize("evidence", ["watchdog", "kernel_flag", "kernel_record", "climb"])
def test_sigkill_with_memory_evidence_is_high_confidence(evidence, monkeypatch):
    monkeypatch.setattr(probes, "kernel_oom_record", lambda pids: None)
    kw: dict = {}
    ws = workers(-9, 0)
    if evidence == "watchdog":
        kw["watchdog_kills"] = [{"pid": 100, "rss": 500 * 2**20, "budget": 400 * 2**20, "t": 1, "main": False}]
    elif evidence == "kernel_flag":
        ws[0].killed_by_kernel_oom = True
    r = run(exceptions=died(100, "DataLoader worker (pid 100) is killed by signal: Killed."), workers=ws, **kw)
    if evidence == "kernel_record":
        r.memory_limit = {"enforced_by": "kernel", "limit": 400 * 2**20, "mechanism": "cgroup v2 memory.max",
                          "kernel_record": {"oom_kill": 1, "pids": [100], "source": "memory.events"}}
    elif evidence == "climb":
        ws[0].peak_rss = 390 * 2**20
        r.memory_limit = {"enforced_by": "kernel", "limit": 400 * 2**20, "mechanism": "x", "kernel_record": None}
    d = explain(r)
    assert d.cause == "oom_killed" and d.confidence == "high", d
    assert "kill -9" not in d.summary


def test_sigterm_of_a_worker_names_the_sender_from_the_environment(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    d = explain(run(exceptions=died(100, "DataLoader worker (pid 100) is killed by signal: Terminated."),
                    workers=workers(-15, 0)))
    assert d.cause == "worker_exit" and "SIGTERM from outside" in d.summary and "torchrun" in d.summary
    own = explain(run(exceptions=died(100, "DataLoader worker (pid 100) exited unexpectedly with exit code 2. "
                                           "Details are lost due to multiprocessing."), workers=workers(2, 0)))
    assert own.cause == "worker_exit" and "its own exit" in own.summary and "SIGTERM" not in own.summary


def test_main_process_stopped_by_sigterm_is_not_the_loaders_fault(monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    d = explain(run(returncode=-15, workers=workers(None, None)))
    assert d.cause == "outside_loader" and "Kubernetes" in " ".join(d.evidence)


def test_sigterm_senders_probe():
    assert probes.sigterm_senders({}) == []
    assert "SLURM" in probes.sigterm_senders({"SLURM_JOB_ID": "1"})[0]
    assert "Kubernetes" in probes.sigterm_senders({"KUBERNETES_SERVICE_HOST": "x"})[0]


# --------------------------------------------------------------------------- fd leak vs IPC
def test_fd_leak_in_the_users_open_vs_ipc_exhaustion():
    leak = ("Caught OSError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n"
            f'  File "{SITE}/torch/utils/data/_utils/worker.py", line 349, in _worker_loop\n    data = fetch()\n'
            '  File "/home/u/data.py", line 20, in __getitem__\n    fh = open(self.paths[i])\n'
            "OSError: [Errno 24] Too many open files: '/data/x.txt'\n")
    d = explain(run(exceptions=[ExceptionInfo("OSError", leak, traceback=frames(USER, NEXT))], workers=workers(0, 0)))
    assert d.cause == "fd_limit" and "your own code" in d.summary and "open(" in d.summary
    assert "with open(path)" in d.fixes[0].text
    ipc = explain(run(exceptions=[ExceptionInfo("RuntimeError", "received 0 items of ancdata", traceback=frames(
        USER, NEXT, (f"{LIB}/multiprocessing/reduction.py", "recvfds")))], workers=workers(0, 0)))
    assert ipc.cause == "fd_limit" and "your own code" not in ipc.summary
    assert any("ulimit" in f.text for f in ipc.fixes)


# --------------------------------------------------------------------------- construction-time errors
def test_caught_init_error_with_fallback_is_diagnosed_and_recovered():
    err = ExceptionInfo("AttributeError", "Can't pickle local object 'D.__init__.<locals>.<lambda>'",
                        traceback=frames(USER, ITER_F, (f"{LIB}/multiprocessing/process.py", "start"),
                                         (f"{LIB}/multiprocessing/popen_spawn_posix.py", "_launch"),
                                         (f"{LIB}/multiprocessing/reduction.py", "dump")))
    later = dict(ITER, t=3.0, iter=2, num_workers=0)
    d = explain(RunResult(outcome="ok", returncode=0, loader_events=[chain_event("init_error", err), later]))
    assert d.cause == "unpicklable_dataset" and d.recovered
    assert "your script recovered" in d.summary and "num_workers=0" in d.summary
    assert any("creating the DataLoader iterator" in e for e in d.evidence)


def test_single_process_segfault_is_not_a_dead_worker():
    d = explain(RunResult(
        outcome="failed", returncode=-11, signal=11, loader_events=[dict(ITER, num_workers=0)]))
    assert d.cause == "native_crash" and "no worker died" in d.summary
    nothing = explain(RunResult(outcome="failed", returncode=-11, signal=11, loader_events=[]))
    assert nothing.cause == "outside_loader"


# --------------------------------------------------------------------------- hangs by progress
def test_stall_is_a_hang_with_the_stacks():
    r = run(outcome="timed_out", returncode=-9, workers=workers(None, None),
            reason="no batch for 5 s (stall=5)")
    r.stall = {"limit": 5, "batches": 3, "idle_s": 5.2}
    r.stacks = {100: 'Thread 0x1 (most recent call first):\n  File "/usr/lib/python3.11/threading.py", line 327 in '
                     'wait\n  File "/home/u/data.py", line 30 in __getitem__\n'}
    d = explain(r)
    assert d.cause == "hang" and d.confidence == "high"
    assert any("stall limit 5" in e and "3 batches" in e for e in d.evidence)
    assert any(e.startswith("stack of pid 100") and "__getitem__" in e for e in d.evidence)


def test_time_limit_without_stall_is_a_weaker_hang():
    d = explain(run(outcome="timed_out", returncode=-9, reason="no result within 10 s"))
    assert d.cause == "hang" and d.confidence in ("low", "medium")
