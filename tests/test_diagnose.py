"""Unit tests of labutils.diagnosis.diagnose (rules on hand-built evidence, live exceptions) and the diagnose CLI."""

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from labutils.diagnosis.diagnose import CAUSES, PRECEDENCE, Diagnosis, Fix, explain
from labutils.runner.result import ExceptionInfo, ProcessInfo, RunResult

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK_STEMS = {p.stem for p in (Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9]*.ipynb")}


# --------------------------------------------------------------------------- helpers
def wrapped(inner_type: str, inner_msg: str, worker: int = 0) -> str:
    """The message PyTorch builds for an exception raised inside a worker."""
    return (f"Caught {inner_type} in DataLoader worker process {worker}.\n"
            "Original Traceback (most recent call last):\n"
            '  File "/x/torch/utils/data/_utils/worker.py", line 374, in _worker_loop\n'
            "    data = fetcher.fetch(index)\n"
            '  File "/home/u/train.py", line 12, in __getitem__\n'
            "    raise thing\n"
            f"{inner_type}: {inner_msg}\n")


def workers(*codes, watchdog=()):
    return [ProcessInfo(pid=100 + i, role="dataloader_worker", exitcode=c, killed_by_watchdog=i in watchdog)
            for i, c in enumerate(codes)]


def died(pid=100, cause_msg=None):
    chain = [ExceptionInfo("RuntimeError", f"DataLoader worker (pid(s) {pid}) exited unexpectedly")]
    if cause_msg:
        chain.append(ExceptionInfo("RuntimeError", cause_msg, link="cause"))
    return chain


ITER = {"event": "iter", "num_workers": 2, "timeout": 0, "start_method": "fork",
        "sharing_strategy": "file_descriptor", "batch_size": 4, "prefetch_factor": 2, "pin_memory": False}


def result(outcome="failed", returncode=1, **kw):
    kw.setdefault("loader_events", [ITER])
    return RunResult(outcome=outcome, returncode=returncode,
                     signal=-returncode if returncode is not None and returncode < 0 else None, **kw)


# --------------------------------------------------------------------------- API shape
def test_diagnosis_api_shape():
    d = explain(result(exceptions=[ExceptionInfo("ValueError", wrapped("ValueError", "bad row 7"))],
                       workers=workers(0, 0)))
    assert isinstance(d, Diagnosis) and d.cause == "worker_exception"
    assert "bad row 7" in d.summary
    assert d.evidence and all(isinstance(e, str) for e in d.evidence)
    assert d.fixes and all(isinstance(f, Fix) and f.notebook in NOTEBOOK_STEMS for f in d.fixes)
    data = d.to_dict()
    assert set(data) >= {"cause", "summary", "evidence", "fixes", "confidence"}
    assert json.loads(json.dumps(data))["fixes"][0]["notebook"] in NOTEBOOK_STEMS
    assert "worker_exception" in str(d) and "notebooks/01_read_the_error.ipynb" in str(d)
    assert "<code" in d._repr_html_()


def test_every_cause_has_fixes_naming_a_notebook():
    from labutils.diagnosis.causes import fixes_for as _fixes

    assert len(CAUSES) == 15 and "outside_loader" in CAUSES
    for cause in CAUSES:
        if cause == "ok":
            continue
        assert cause in PRECEDENCE
        fixes = _fixes(cause)
        assert fixes, cause
        assert all(f.notebook in NOTEBOOK_STEMS for f in fixes), cause


def test_explain_rejects_other_objects():
    with pytest.raises(TypeError):
        explain(b"DataLoader worker exited unexpectedly")
    with pytest.raises(TypeError):
        explain(42)
    assert explain("DataLoader worker exited unexpectedly").source == "log"  # a str is a log's text


# --------------------------------------------------------------------------- one rule per cause
def test_ok():
    d = explain(result(outcome="ok", returncode=0, workers=workers(0, 0)))
    assert d.cause == "ok" and not d.fixes


def test_worker_exception():
    d = explain(result(exceptions=[ExceptionInfo("KeyError", wrapped("KeyError", "'dgo'", 1))]))
    assert d.cause == "worker_exception"
    assert "KeyError" in d.summary


def test_unpicklable_dataset():
    tb = ('  File "/home/u/train.py", line 40, in <module>\n    for batch in loader:\n'
          '  File "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 491, in __iter__\n'
          '  File "/usr/lib/python3.11/multiprocessing/process.py", line 121, in start\n'
          '  File "/usr/lib/python3.11/multiprocessing/popen_spawn_posix.py", line 47, in _launch\n'
          '  File "/usr/lib/python3.11/multiprocessing/reduction.py", line 60, in dump\n')
    exc = ExceptionInfo("TypeError", "cannot pickle '_io.TextIOWrapper' object", traceback=tb)
    d = explain(result(exceptions=[exc], workers=workers(1)))
    assert d.cause == "unpicklable_dataset"


def test_unpicklable_from_stderr_warning_when_caught():
    stderr = ("/x/torch/utils/data/dataloader.py:1179: UserWarning: Got pickle error when attempting to start "
              "a worker Process. This might be because the worker Process arguments are not picklable.\n")
    d = explain(result(outcome="ok", returncode=0, stderr=stderr))
    assert d.cause == "unpicklable_dataset"


def test_main_not_importable():
    stderr = ("Traceback (most recent call last):\n"
              '  File "<string>", line 1, in <module>\n'
              '  File "/usr/lib/python3.11/multiprocessing/spawn.py", line 132, in _main\n'
              "    self = reduction.pickle.load(from_parent)\n"
              "AttributeError: Can't get attribute 'Shapes' on <module '__main__' (built-in)>\n")
    d = explain(result(exceptions=died(101, "DataLoader worker (pid 101) exited unexpectedly with exit code 1. "
                                            "Details are lost due to multiprocessing."),
                       workers=workers(1, 1), stderr=stderr))
    assert d.cause == "main_not_importable"


def test_main_not_importable_when_two_workers_print_at_once():
    """Two spawned workers fail together and their line-buffered stderr interleaves line by line."""
    one = ["Traceback (most recent call last):",
           '  File "<string>", line 1, in <module>',
           '  File "/usr/lib/python3.11/multiprocessing/spawn.py", line 132, in _main',
           "    self = reduction.pickle.load(from_parent)",
           "AttributeError: Can't get attribute 'Shapes' on <module '__main__' (built-in)>"]
    stderr = "".join(f"{line}\n{line}\n" for line in one)
    d = explain(result(exceptions=died(101, "DataLoader worker (pid 101) exited unexpectedly with exit code 1. "
                                            "Details are lost due to multiprocessing."),
                       workers=workers(1, 1), stderr=stderr))
    assert d.cause == "main_not_importable", d.evidence


SPAWN_CHILD_TB = ("Traceback (most recent call last):\n"
                  '  File "<string>", line 1, in <module>\n'
                  '  File "/usr/lib/python3.11/multiprocessing/spawn.py", line 122, in spawn_main\n'
                  "    exitcode = _main(fd, parent_sentinel)\n"
                  '  File "/usr/lib/python3.11/multiprocessing/spawn.py", line 131, in _main\n'
                  "    prepare(preparation_data)\n"
                  '  File "/usr/lib/python3.11/multiprocessing/spawn.py", line 140, in _check_not_importing_main\n'
                  "    raise RuntimeError(...)\n")


def test_missing_main_guard_beats_the_hang_it_causes():
    stderr = (SPAWN_CHILD_TB + "RuntimeError: \n        An attempt has been made to start a new process before "
              "the\n        current process has finished its bootstrapping phase.\n")
    d = explain(result(outcome="timed_out", returncode=-9, stderr=stderr, reason="no result within 10 s"))
    assert d.cause == "missing_main_guard"


GUARD_MESSAGE = ("RuntimeError: \n        An attempt has been made to start a new process before the\n"
                 "        current process has finished its bootstrapping phase.\n\n"
                 "        This probably means that you are not using fork to start your\n")


def _interleave(text: str, how: str) -> str:
    """Two processes printing ``text`` at once, each line whole, in three orders seen in CI."""
    lines = text.splitlines()
    if how == "lines":  # alternating line by line
        return "".join(f"{line}\n{line}\n" for line in lines)
    if how == "offset":  # the second process starts three lines later
        a, b, out = list(lines), list(lines), []
        out += a[:3]
        for x, y in zip(a[3:], b):
            out += [x, y]
        out += b[len(a) - 3:]
        return "\n".join(out) + "\n"
    cut = next(i for i, line in enumerate(lines) if line.startswith("RuntimeError"))
    return "\n".join(lines[:cut] + lines[:cut] + lines[cut:] + lines[cut:]) + "\n"  # "blocks"


@pytest.mark.parametrize("how", ["lines", "offset", "blocks"])
def test_missing_main_guard_when_two_workers_print_at_once(how):
    """CI saw `worker_exit` here: the second worker's Traceback header ended the first one's frames."""
    stderr = _interleave(SPAWN_CHILD_TB + GUARD_MESSAGE, how)
    d = explain(result(exceptions=died(101, "DataLoader worker (pid 101) exited unexpectedly with exit code 1. "
                                            "Details are lost due to multiprocessing."),
                       workers=workers(1, 1), stderr=stderr))
    assert d.cause == "missing_main_guard", d.evidence


# Captured from two spawned workers of a script without the main guard (2026-12-04, 2 runs in 30 here): one
# worker's source line `raise RuntimeError(...` was written as its indent, then the other worker's frame
# line, then its text; the diagnosis took that text for the exception line and said worker_exit.
PIECES = [
    'Traceback (most recent call last):',
    '  File "/usr/lib/python3.11/multiprocessing/popen_spawn_posix.py", line 42, in _launch',
    '  File "<string>", line 1, in <module>',
    '  File "/usr/lib/python3.11/multiprocessing/spawn.py", line 122, in spawn_main',
    '    prep_data = spawn.get_preparation_data(process_obj._name)',
    '                ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^',
    '  File "/usr/lib/python3.11/multiprocessing/spawn.py", line 164, in get_preparation_data',
    '    exitcode = _main(fd, parent_sentinel)',
    '    _check_not_importing_main()',
    '  File "/usr/lib/python3.11/multiprocessing/spawn.py", line 140, in _check_not_importing_main',
    '               ^^^^^^^^^^^^^^^^^^^^^^^^^^',
    '      File "/usr/lib/python3.11/multiprocessing/spawn.py", line 131, in _main',
    "raise RuntimeError('''",
    'RuntimeError: ',
    '        An attempt has been made to start a new process before the',
    '        current process has finished its bootstrapping phase.',
    '',
    '        This probably means that you are not using fork to start your',
    '    prepare(preparation_data)',
    '  File "/usr/lib/python3.11/multiprocessing/spawn.py", line 246, in prepare',
]


# The same run, its lines cut up further (a row of carets is written a caret at a time): no traceback's last
# line is its exception line, but the guard's message, one write, is whole (1 run in 6 of 30 here).
CARETS = [
    "Traceback (most recent call last):",
    '  File "<string>", line 1, in <module>',
    '  File "/usr/lib/python3.11/multiprocessing/spawn.py", line 122, in spawn_main',
    "               ^^^^^    ^self._popen = self._Popen(self)^",
    "^^^^^^^^^^^^^^ ^ ^ ^ ^ ^ ",
    '      File "/usr/lib/python3.11/multiprocessing/spawn.py", line 131, in _main',
    "^^^^^^^^^^^^^^^^^^^^^ File \"/usr/lib/python3.11/multiprocessing/spawn.py\", line 246, in prepare",
    "RuntimeError: ",
    "        An attempt has been made to start a new process before the",
    "        current process has finished its bootstrapping phase.",
]


@pytest.mark.parametrize("lines", [PIECES, CARETS], ids=["inside_a_line", "carets"])
def test_missing_main_guard_when_two_workers_cut_each_others_lines_up(lines):
    d = explain(result(exceptions=died(101, "DataLoader worker (pid 101) exited unexpectedly with exit code 1. "
                                            "Details are lost due to multiprocessing."),
                       workers=workers(1, 1), stderr="\n".join(lines) + "\n"))
    assert d.cause == "missing_main_guard", d.evidence


def test_a_workers_fd_error_is_found_when_its_traceback_is_cut_up():
    """notebook 06's worker-side fd wall (1 run in 5 of a soak said worker_exit): two workers' tracebacks."""
    stderr = ("Traceback (most recent call last):\n"
              '  File "/usr/lib/python3.11/multiprocessing/queues.py", line 244, in _feed\n'
              '    obj = _ForkingPickler.dumps(obj)\n'
              '          ^^^^^^^^^^^^^^^    ^^^  File "/usr/lib/python3.11/multiprocessing/reduction.py", line 51\n'
              "^^^^^^^^ ^ ^ ^\n"
              "OSError: [Errno 24] Too many open files\n")
    eof = [ExceptionInfo("EOFError", "", traceback='  File "/x/torch/utils/data/dataloader.py", line 1, in _get\n')]
    d = explain(result(exceptions=eof, workers=workers(0, 0), stderr=stderr))
    assert d.cause == "fd_limit", (d.cause, d.evidence)



def test_an_fd_sharer_that_cannot_open_a_segment_for_want_of_fds_is_fd_limit():
    """notebook 06's worker-side fd wall under forkserver (once, in a matrix run): the queue feeder printed
    torch's "unable to open shared memory object ... Too many open files (24)", which names /dev/shm but is
    the open-files limit (errno 24, EMFILE), not a full /dev/shm (errno 28)."""
    stderr = ("Traceback (most recent call last):\n"
              '  File "/usr/lib/python3.11/multiprocessing/queues.py", line 244, in _feed\n'
              "    obj = _ForkingPickler.dumps(obj)\n"
              '  File "/x/torch/multiprocessing/reductions.py", line 600, in reduce_storage\n'
              "RuntimeError: unable to open shared memory object </torch_7038_839314994_111> in read-write mode: "
              "Too many open files (24)\n")
    eof = [ExceptionInfo("EOFError", "", traceback='  File "/x/torch/utils/data/dataloader.py", line 1, in _get\n')]
    d = explain(result(exceptions=eof, workers=workers(-15, -15), stderr=stderr))
    assert d.cause == "fd_limit", (d.cause, d.evidence)

def test_native_crash_from_exit_code_and_stderr():
    d = explain(result(exceptions=died(100, "DataLoader worker (pid 100) is killed by signal: Segmentation fault."),
                       workers=workers(-11, 0),
                       stderr="ERROR: Unexpected segmentation fault encountered in worker.\n"))
    assert d.cause == "native_crash" and d.confidence == "high"
    assert any("SIGSEGV" in e for e in d.evidence)


@pytest.mark.parametrize("sig", [6, 8, 4])
def test_other_fatal_signals_are_native_crashes(sig):
    d = explain(result(exceptions=died(100), workers=workers(-sig)))
    assert d.cause == "native_crash"


# A spawned worker that the loader's shutdown stops can abort in its interpreter's exit (Python 3.11: its
# queue feeder thread, a daemon, is ended with pthread_exit inside torch). CI once had it in notebook 04's
# OOM run: the other worker was the kernel's victim, named by PyTorch, and this SIGABRT came 0.16 s later.
KILLED = "DataLoader worker (pid 101) is killed by signal: Killed. "
ABORT_LINE = "terminate called without an active exception\n"


def oom_then_abort(exceptions, events=(), error_t=None, abort_code=-6, event="error"):
    kernel = {"enforced_by": "kernel", "limit": 2**30, "mechanism": "cgroup v1 child",
              "kernel_record": {"oom_kill": 1, "killed_pids": [101], "killed_pids_from": "dmesg"}}
    procs = [ProcessInfo(pid=100, role="dataloader_worker", exitcode=abort_code),
             ProcessInfo(pid=101, role="dataloader_worker", exitcode=-9, killed_by_kernel_oom=True)]
    loader = [dict(ITER, start_method="spawn")]
    if error_t is not None:
        loader.append({"event": event, "t": error_t, "chain": [
            {"type": e.type, "message": e.message, "link": e.link} for e in exceptions]})
    return result(exceptions=exceptions, workers=procs, memory_limit=kernel, stderr=ABORT_LINE,
                  events=[{"t": t, "pid": pid, "signal": sig} for t, pid, sig in events], loader_events=loader)


def test_a_worker_aborting_at_shutdown_after_the_oom_kill_does_not_hide_it():
    # what CI recorded: PyTorch's list of the dead workers, made when it raised, leaves the aborted one out
    d = explain(oom_then_abort(died(101, KILLED), events=[(10.080, 101, 9), (10.236, 100, 6)], error_t=10.076))
    assert d.cause == "oom_killed" and d.confidence == "high", (d.cause, d.evidence)
    assert "kernel's OOM killer" in d.summary
    after = [e for e in d.evidence if "pid 100" in e and "after the failure" in e]
    assert after and "terminate called" in after[0] and after[0].startswith("echo of the failure above"), d.evidence
    assert "worker pid 100: killed by SIGABRT (after the failure: while the DataLoader shut its workers down)" \
        in d.evidence


def test_a_later_native_death_needs_the_runners_times_when_pytorch_names_one_worker():
    # the handler's message alone names only the worker it found: the runner's times must show the other
    # worker still alive after that death and after the raise (CI's second shape here: the handler raised
    # in the main process, recorded as "sigchld_error", and the abort came 0.05 s after the victim)
    chain = [ExceptionInfo("RuntimeError", KILLED)]
    for event in ("sigchld_error", "error"):
        later = explain(oom_then_abort(chain, events=[(10.528, 101, 9), (10.580, 100, 6)], error_t=10.504,
                                       event=event))
        assert later.cause == "oom_killed" and later.confidence == "high", later.evidence
        assert any("0.05 s after pid(s) 101, and after the error was raised" in e for e in later.evidence)
    for events, error_t in (([(10.080, 101, 9), (10.080, 100, 6)], 10.076),  # the same tick: no order
                            ([(10.030, 100, 6), (10.080, 101, 9)], 10.076),  # it died first
                            ([(10.080, 101, 9), (10.236, 100, 6)], 10.300),  # before the error was raised
                            ([], None)):  # no times at all
        d = explain(oom_then_abort(chain, events=events, error_t=error_t))
        assert d.cause == "native_crash", (events, error_t, d.evidence)


@pytest.mark.parametrize("sig", [6, 11])
def test_a_native_crash_pytorch_names_is_the_cause_whatever_died_after_it(sig):
    message = "Aborted" if sig == 6 else "Segmentation fault"
    chain = died(100, f"DataLoader worker (pid 100) is killed by signal: {message}.")
    d = explain(oom_then_abort(chain, events=[(10.0, 100, sig), (10.3, 101, 9)], error_t=10.01, abort_code=-sig))
    assert d.cause == "native_crash" and not any("after the failure" in e for e in d.evidence), d.evidence
    both = explain(oom_then_abort(died("101, 100"), events=[(10.0, 100, sig), (10.0, 101, 9)], abort_code=-sig))
    assert both.cause == "native_crash", both.evidence  # dead when PyTorch raised: it may be the reason


def test_oom_killed_by_watchdog():
    kills = [{"pid": 100, "rss": 450 * 2**20, "budget": 400 * 2**20, "t": 1.0, "main": False}]
    d = explain(result(exceptions=died(100, "DataLoader worker (pid 100) is killed by signal: Killed."),
                       workers=workers(-9, 0, watchdog=(0,)), watchdog_kills=kills))
    assert d.cause == "oom_killed"
    assert "watchdog" in d.summary and any("watchdog" in e for e in d.evidence)


def test_main_process_killed_by_watchdog_is_oom():
    kills = [{"pid": 99, "rss": 900 * 2**20, "budget": 800 * 2**20, "t": 1.0, "main": True}]
    d = explain(result(returncode=-9, watchdog_kills=kills, loader_events=[]))
    assert d.cause == "oom_killed"


def test_shm_exhausted_from_worker_exception():
    inner = ("unable to allocate shared memory(shm) for file </torch_123_456_0>: "
             "No space left on device (28)")
    d = explain(result(exceptions=[ExceptionInfo("RuntimeError", wrapped("RuntimeError", inner))]))
    assert d.cause == "shm_exhausted"


def test_sigbus_is_shm_only_where_the_runs_dev_shm_evidence_agrees():
    line = ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
            "memory (shm).\n")
    d = explain(result(exceptions=died(100), workers=workers(-7), stderr=line, options={"shm_size": 8 << 20}))
    assert d.cause == "shm_exhausted"  # a private /dev/shm of 8 MiB: the run's own evidence agrees
    # the same words with /dev/shm not short (this machine's, nothing in the record): the reader's own bus error
    other = explain(result(exceptions=died(100), workers=workers(-7), stderr=line))
    assert other.cause == "native_crash" and other.confidence == "medium", other
    assert any("not short" in e for e in other.evidence), other.evidence


def test_sigkill_with_no_space_left_on_shm_is_shm():
    stderr = ("Traceback (most recent call last):\n"
              '  File "/usr/lib/python3.11/multiprocessing/queues.py", line 244, in _feed\n'
              "    obj = _ForkingPickler.dumps(obj)\n"
              '  File "/x/torch/multiprocessing/reductions.py", line 600, in reduce_storage\n'
              "RuntimeError: unable to write to file </torch_77_1_0>: No space left on device (28)\n")
    d = explain(result(exceptions=died(100), workers=workers(-9), stderr=stderr))
    assert d.cause == "shm_exhausted"


def test_fd_limit_main_error():
    msg = ("Too many open files. Communication with the workers is no longer possible. Please increase the "
           "limit using `ulimit -n` in the shell")
    d = explain(result(exceptions=[ExceptionInfo("RuntimeError", msg)], workers=workers(0, 0)))
    assert d.cause == "fd_limit"


def test_fd_limit_beats_the_hang_it_causes():
    stderr = ("Traceback (most recent call last):\n  File \"/x/multiprocessing/queues.py\", line 244, in _feed\n"
              "OSError: [Errno 24] Too many open files\n")
    d = explain(result(outcome="timed_out", returncode=-9, stderr=stderr, reason="no result within 15 s"))
    assert d.cause == "fd_limit"


def test_ancdata_is_fd_limit():
    d = explain(result(exceptions=[ExceptionInfo("RuntimeError", "received 0 items of ancdata")]))
    assert d.cause == "fd_limit"


def test_worker_exit_code():
    d = explain(result(exceptions=died(100, "DataLoader worker (pid 100) exited unexpectedly with exit code 2. "
                                            "Details are lost due to multiprocessing."),
                       workers=workers(2, 0)))
    assert d.cause == "worker_exit" and "2" in d.summary


def test_worker_exit_when_main_loses_the_race():
    # the worker died after sending a batch; the main process fails while rebuilding it (FACTS.md)
    exc = ExceptionInfo("FileNotFoundError", "[Errno 2] No such file or directory",
                        traceback='  File "/x/torch/multiprocessing/reductions.py", line 1, in rebuild_storage_fd\n')
    d = explain(result(exceptions=[exc], workers=workers(3, 0)))
    assert d.cause == "worker_exit"


def test_timeout():
    d = explain(result(exceptions=[ExceptionInfo("RuntimeError", "DataLoader timed out after 5 seconds")],
                       workers=workers(-15, -15)))
    assert d.cause == "timeout"


def test_hang():
    dump = 'Thread 0x1 (most recent call first):\n  File "/x/dataloader.py", line 1, in _try_get_data\n'
    d = explain(result(outcome="timed_out", returncode=-9, reason="no result within 8 s", stderr=dump))
    assert d.cause == "hang"
    assert any("waiting for a batch" in e for e in d.evidence)


def test_cuda_in_worker_cpu_build():
    d = explain(result(exceptions=[ExceptionInfo("AssertionError",
                                                 wrapped("AssertionError", "Torch not compiled with CUDA enabled"))]))
    assert d.cause == "cuda_in_worker"


def test_cuda_in_forked_worker():
    inner = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the "
             "'spawn' start method")
    d = explain(result(exceptions=[ExceptionInfo("RuntimeError", wrapped("RuntimeError", inner))]))
    assert d.cause == "cuda_in_worker"


def test_unsupported_run():
    d = explain(RunResult(outcome="unsupported", reason="no private mount namespace"))
    assert d.cause == "unsupported"


def test_failure_outside_the_dataloader_is_outside_loader():
    tb = ('  File "/home/u/train.py", line 30, in <module>\n    loss = model(x)\n'
          '  File "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 125, in forward\n')
    d = explain(result(exceptions=[ExceptionInfo("RuntimeError", "mat1 and mat2 shapes cannot be multiplied",
                                                 traceback=tb)], workers=workers(0, -15)))
    assert d.cause == "outside_loader" and d.confidence == "high"
    assert "mat1 and mat2" in d.summary and "not to blame" in d.summary
    assert not d.blames_loader


def test_bare_message_without_origin_is_unknown():
    d = explain(result(exceptions=[ExceptionInfo("RuntimeError", "something odd")], workers=workers(0, 0)))
    assert d.cause == "unknown"


def test_single_process_loader_error_is_worker_exception():
    chain = [{"type": "ValueError", "message": "bad row", "module": "builtins", "link": None, "traceback": ""}]
    r = result(exceptions=[ExceptionInfo("ValueError", "bad row")],
               loader_events=[dict(ITER, num_workers=0), {"event": "error", "chain": chain}])
    assert explain(r).cause == "worker_exception"


# --------------------------------------------------------------------------- precedence and deception
def test_user_message_quoting_exited_unexpectedly_stays_worker_exception():
    inner = ("DataLoader worker (pid(s) 1234) exited unexpectedly; killed by signal: Segmentation fault. "
             "Too many open files")
    msg = wrapped("ValueError", inner)
    stderr = "Traceback (most recent call last):\n  File \"x\", line 1\nValueError: " + msg + "\n"
    d = explain(result(exceptions=[ExceptionInfo("ValueError", msg)], workers=workers(0, 0), stderr=stderr))
    assert d.cause == "worker_exception"


def test_stderr_line_echoing_the_recorded_exception_is_not_new_evidence():
    msg = wrapped("RuntimeError", "ERROR: Unexpected segmentation fault encountered in worker. (our test)")
    d = explain(result(exceptions=[ExceptionInfo("RuntimeError", msg)], workers=workers(0, 0),
                       stderr="RuntimeError: " + msg))
    assert d.cause == "worker_exception"


def test_caught_error_in_a_script_that_exits_0_is_still_diagnosed():
    chain = [{"type": "RuntimeError", "message": "DataLoader worker (pid(s) 100) exited unexpectedly",
              "module": "builtins", "link": None, "traceback": ""}]
    r = result(outcome="ok", returncode=0, workers=workers(-9, 0),
               loader_events=[ITER, {"event": "error", "chain": chain}])
    d = explain(r)
    assert d.cause == "oom_killed" and "exited 0" in d.summary


def test_sigterm_at_shutdown_does_not_hide_the_worker_exception():
    d = explain(result(exceptions=[ExceptionInfo("KeyError", wrapped("KeyError", "'x'"))], workers=workers(-15, 0)))
    assert d.cause == "worker_exception"


def test_generic_message_without_anything_else_is_worker_exit_low_confidence():
    d = explain(result(exceptions=died(100), workers=[]))
    assert d.cause == "worker_exit" and d.confidence == "low"


# --------------------------------------------------------------------------- live exceptions in this process
class _Raises:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            raise ValueError("sample 3 is broken")
        return i


class _Killed:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return i


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_live_worker_exception():
    from torch.utils.data import DataLoader

    with pytest.raises(ValueError) as info:
        list(DataLoader(_Raises(), batch_size=2, num_workers=2, multiprocessing_context="fork"))
    d = explain(info.value)
    assert d.cause == "worker_exception" and d.source == "exception"
    assert "sample 3 is broken" in d.summary
    assert any("only" in e and "exception chain" in e for e in d.evidence)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_live_sigkilled_worker():
    from torch.utils.data import DataLoader

    with pytest.raises(RuntimeError) as info:
        list(DataLoader(_Killed(), batch_size=2, num_workers=2, multiprocessing_context="fork"))
    d = explain(info.value)
    assert d.cause == "oom_killed"
    assert any("SIGKILL" in e or "Killed" in e for e in d.evidence)


def test_live_spawn_from_a_fileless_main_is_main_not_importable(monkeypatch):
    import types

    from torch.utils.data import DataLoader

    fake_main = types.ModuleType("__main__")  # like a notebook kernel: no __file__
    cls = type("NotebookData", (_Raises,), {"__module__": "__main__"})
    fake_main.NotebookData = cls
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    it = iter(DataLoader(cls(), batch_size=2, num_workers=1, multiprocessing_context="spawn"))
    try:
        with pytest.raises(RuntimeError) as info:
            list(it)
        d = explain(info.value)
    finally:
        # the iterator and its queues' semaphores (spawn: named sem.mp-* files) are held by the exception's
        # traceback, a cycle: free them now, not whenever the collector next runs (the session's leak check
        # found 11 such files when it had not run by the session's end)
        it._shutdown_workers()
        del it
        info = None
        gc.collect()
    assert d.cause == "main_not_importable"
    assert any("no file a new process could import" in e for e in d.evidence)


# --------------------------------------------------------------------------- the diagnose CLI
def cli(*args, timeout=300, cwd=None):
    return subprocess.run([PY, "-m", "labutils", "diagnose", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or ROOT)


def usage(capsys, *args):
    """``diagnose_main`` in this process, for the usage errors: (exit status, stderr). The command line
    itself (``python -m labutils diagnose``) is run by the tests around these."""
    from labutils.commands.diagnose import diagnose_main

    capsys.readouterr()
    rc = diagnose_main(list(args))
    return rc, capsys.readouterr().err


def test_cli_missing_file(tmp_path, capsys):
    rc, err = usage(capsys, str(tmp_path / "nope.py"))
    assert rc == 2 and "no such file" in err
    assert "Traceback" not in err


def test_cli_not_python(tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("this is not a training script: {[\n")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x7fELF\x00\x00\x01")
    for path in (text, binary):
        rc, err = usage(capsys, str(path))
        assert rc == 2 and "not a Python script" in err


@pytest.mark.parametrize("args", [["--bogus", "x.py"], ["--timeout", "soon", "x.py"], ["--nofile", "3", "x.py"],
                                  ["--start-method", "thread", "x.py"], ["--memory-budget", "lots", "x.py"],
                                  ["--max-processes", "1", "x.py"], []])
def test_cli_bad_options(args, tmp_path, capsys, monkeypatch):
    (tmp_path / "x.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    rc, err = usage(capsys, *args)
    assert rc == 2 and "labutils diagnose:" in err
    assert "Traceback" not in err


def test_cli_script_arguments_after_script_are_the_scripts(tmp_path):
    script = tmp_path / "args.py"
    script.write_text("import sys\nprint('ARGS', sys.argv[1:])\n")
    done = cli("--json", "--timeout", "60", str(script), "--timeout", "5", "--json", "-x")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert "ARGS ['--timeout', '5', '--json', '-x']" in data["stdout"]
    assert data["cause"] == "ok"


def test_cli_json_healthy_script():
    script = os.path.join(ROOT, "labutils", "scenarios", "ok_healthy.py")
    done = cli("--json", script)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert {"cause", "summary", "evidence", "fixes", "outcome", "exit", "workers"} <= set(data)
    assert data["cause"] == "ok" and data["outcome"] == "ok"
    assert data["launcher"]["kind"] == "cold", data["launcher"]  # the healthy scenario's cold check
    assert len([w for w in data["workers"] if w["role"] == "dataloader_worker"]) >= 2
    assert "epoch 1" in data["stdout"]


def test_cli_script_that_catches_the_crash_and_exits_0(tmp_path):
    script = tmp_path / "catches.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        from torch.utils.data import DataLoader, Dataset

        class D(Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, i):
                if i == 5:
                    raise IndexError("row 5 is missing")
                return torch.tensor(i)

        if __name__ == "__main__":
            try:
                for b in DataLoader(D(), batch_size=2, num_workers=2):
                    pass
            except Exception as e:
                print("ignored:", type(e).__name__)
            sys.exit(0)
    """))
    done = cli(str(script))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ignored: IndexError" in done.stdout  # the script's own output is shown
    assert "cause: worker_exception" in done.stdout


RACE_TB = ('Traceback (most recent call last):\n  File ".../torch/multiprocessing/reductions.py", line 541, '
           'in rebuild_storage_fd\n    fd = df.detach()\n  File ".../multiprocessing/resource_sharer.py", '
           'line 57, in detach\nFileNotFoundError: [Errno 2] No such file or directory\n')


def test_fetch_race_with_a_dead_worker_is_a_worker_death_not_a_dataset_error():
    # FACTS.md: a worker that exits after sending a batch can make the main fail in rebuild_storage_fd.
    race = ExceptionInfo("FileNotFoundError", "[Errno 2] No such file or directory", traceback=RACE_TB)
    quiet = explain(result(exceptions=[race], workers=workers(0, 0)))
    assert quiet.cause == "worker_exit" and quiet.cause != "worker_exception"
    assert any("already exited" in line for line in quiet.evidence)
    killed = explain(result(exceptions=[race], workers=workers(-9, 0)))
    assert killed.cause == "oom_killed"


# --------------------------------------------------------------------------- echoes of a worker death
# Frames recorded on this machine (torch 2.13, Python 3.11) from notebook 01's staged hand-over deaths.
_HANDOVER = ('Traceback (most recent call last):\n'
             '  File "/v/torch/utils/data/dataloader.py", line 1291, in _try_get_data\n'
             '    data = self._data_queue.get(timeout=timeout)\n'
             '  File "/py/multiprocessing/queues.py", line 122, in get\n'
             '    return _ForkingPickler.loads(res)\n'
             '  File "/v/torch/multiprocessing/reductions.py", line 538, in rebuild_storage_fd\n'
             '    fd = df.detach()\n'
             '  File "/py/multiprocessing/resource_sharer.py", line 58, in detach\n'
             '    return reduction.recv_handle(conn)\n'
             '  File "/py/multiprocessing/reduction.py", line 189, in recv_handle\n'
             '    return recvfds(s, 1)[0]\n')
RESET_TB = (_HANDOVER + '  File "/py/multiprocessing/reduction.py", line 157, in recvfds\n'
            '    msg, ancdata, flags, addr = sock.recvmsg(1, socket.CMSG_SPACE(bytes_size))\n'
            'ConnectionResetError: [Errno 104] Connection reset by peer\n')
EOF_TB = (_HANDOVER + '  File "/py/multiprocessing/reduction.py", line 159, in recvfds\n    raise EOFError\nEOFError\n')
KILLED_IN_RECVFDS_TB = (_HANDOVER + '  File "/py/multiprocessing/reduction.py", line 157, in recvfds\n'
                        '  File "/v/torch/utils/data/_utils/signal_handling.py", line 73, in handler\n'
                        '    _error_if_any_worker_fails()\n'
                        'RuntimeError: DataLoader worker (pid 100) is killed by signal: Killed. \n')


def _echo_lines(d):
    return [line for line in d.evidence if "an echo" in line]


def test_connection_reset_under_killed_by_signal_is_an_echo_of_the_sigkill():
    chain = [ExceptionInfo("RuntimeError", "DataLoader worker (pid(s) 100) exited unexpectedly"),
             ExceptionInfo("RuntimeError", "DataLoader worker (pid 100) is killed by signal: Killed. ", link="cause",
                           traceback=KILLED_IN_RECVFDS_TB),
             ExceptionInfo("ConnectionResetError", "[Errno 104] Connection reset by peer", link="context",
                           traceback=RESET_TB)]
    d = explain(result(exceptions=chain, workers=workers(-9, 0)))
    assert d.cause == "oom_killed" and d.confidence == "low", d
    assert any("ConnectionResetError" in line for line in _echo_lines(d)), d.evidence


@pytest.mark.parametrize("exc_type, message, tb", [
    ("ConnectionResetError", "[Errno 104] Connection reset by peer", RESET_TB),
    ("EOFError", "", EOF_TB),
])
def test_bare_handover_echo_is_named_by_the_worker_exit_status(exc_type, message, tb):
    echo = ExceptionInfo(exc_type, message, traceback=tb)
    killed = explain(result(exceptions=[echo], workers=workers(-9, 0)))  # forkserver: no SIGCHLD message
    assert killed.cause == "oom_killed", killed
    exited = explain(result(exceptions=[echo], workers=workers(0, 0)))  # a worker that exit(0)ed
    assert exited.cause == "worker_exit" and exited.cause != "worker_exception", exited
    for d in (killed, exited):
        assert any(exc_type in line for line in _echo_lines(d)), d.evidence


def test_the_same_errors_outside_the_handover_are_not_echoes():
    # A ConnectionResetError raised by the user's own code (an HTTP fetch) with no worker death is not one.
    tb = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 9, in <module>\n    fetch()\n'
          '  File "/home/u/net.py", line 3, in fetch\n    sock.recv(1)\nConnectionResetError: [Errno 104] '
          'Connection reset by peer\n')
    d = explain(result(exceptions=[ExceptionInfo("ConnectionResetError", "[Errno 104] Connection reset by peer",
                                                 traceback=tb)], workers=workers(0, 0)))
    assert d.cause == "outside_loader" and not _echo_lines(d), d


# --------------------------------------------------------------------------- fork refused
_WORKER_START = ('Traceback (most recent call last):\n'
                 '  File "/v/torch/utils/data/dataloader.py", line 1176, in __init__\n    w.start()\n'
                 '  File "/py/multiprocessing/process.py", line 121, in start\n'
                 '    self._popen = self._Popen(self)\n')
FORK_TB = (_WORKER_START + '  File "/py/multiprocessing/popen_fork.py", line 66, in _launch\n'
           '    self.pid = os.fork()\n')
SPAWN_TB = (_WORKER_START + '  File "/py/multiprocessing/util.py", line 453, in spawnv_passfds\n'
            '    return _posixsubprocess.fork_exec(\n')
THREAD_TB = ('Traceback (most recent call last):\n'
             '  File "/v/torch/utils/data/dataloader.py", line 1250, in _try_put_index\n'
             '    self._index_queues[worker_queue_idx].put((self._send_idx, index))\n'
             '  File "/py/multiprocessing/queues.py", line 177, in _start_thread\n    self._thread.start()\n'
             '  File "/py/threading.py", line 964, in start\n    _start_new_thread(self._bootstrap, ())\n')


@pytest.mark.parametrize("exc_type, message, tb, variant_word", [
    ("BlockingIOError", "[Errno 11] Resource temporarily unavailable", FORK_TB + "BlockingIOError\n", "process"),
    ("BlockingIOError", "[Errno 11] Resource temporarily unavailable", SPAWN_TB + "BlockingIOError\n", "process"),
    ("OSError", "[Errno 12] Cannot allocate memory", FORK_TB + "OSError\n", "process"),
    ("RuntimeError", "can't start new thread", THREAD_TB + "RuntimeError\n", "thread"),
])
def test_a_refused_fork_or_thread_at_worker_start_is_fork_refused(exc_type, message, tb, variant_word):
    d = explain(result(exceptions=[ExceptionInfo(exc_type, message, traceback=tb)], workers=workers(0, 0)))
    assert d.cause == "fork_refused" and d.confidence == "high", d
    assert any(f"refused a new {variant_word}" in line for line in d.evidence), d.evidence
    assert ("threads as well as processes" in d.summary) == (variant_word == "thread")
    assert any("ulimit -u" in f.text for f in d.fixes)


def test_eagain_from_the_users_own_socket_is_not_fork_refused():
    tb = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 9, in <module>\n    poll()\n'
          '  File "/home/u/net.py", line 3, in poll\n    sock.recv(1)\nBlockingIOError\n')
    d = explain(result(exceptions=[ExceptionInfo("BlockingIOError", "[Errno 11] Resource temporarily unavailable",
                                                 traceback=tb)], workers=workers(0, 0)))
    assert d.cause != "fork_refused", d


# --------------------------------------------------------------------------- shared memory by torch version
# torch >= 2.10 reserves a segment up front (posix_fallocate): a full /dev/shm is an exception in the worker.
# The first text was measured here (torch 2.13); the errno after the colon can be stale (pytorch issue
# 176069), so only the stable prefix may decide. The torch < 2.10 texts are recorded samples, not runs:
# only torch 2.13 is installed here.
SHM_NEW = "unable to allocate shared memory(shm) for file </torch_123_456_0>: No space left on device (28)"
SHM_NEW_STALE = "unable to allocate shared memory(shm) for file </torch_123_456_0>: Success (0)"
SHM_OLD_WRITE = "unable to write to file </torch_123_456_0>: No space left on device (28)"  # recorded, torch < 2.10
BUS_LINE = ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
            "memory (shm).\n")
BUS_CAUSE = ("DataLoader worker (pid 100) is killed by signal: Bus error. It is possible that dataloader's "
             "workers are out of shared memory. Please try to raise your shared memory limit.")


@pytest.mark.parametrize("inner", [SHM_NEW, SHM_NEW_STALE, SHM_OLD_WRITE], ids=["2.10+", "2.10+stale-errno", "old"])
def test_full_shm_as_a_worker_exception_by_torch_version(inner):
    d = explain(result(exceptions=[ExceptionInfo("RuntimeError", wrapped("RuntimeError", inner))],
                       workers=workers(0, 0)))
    assert d.cause == "shm_exhausted", d


def test_full_shm_as_sigbus_in_older_torch_releases():
    # torch 2.7-2.9 (recorded sample): the worker touches an unbacked page, prints the bus-error line, dies of
    # SIGBUS; PyTorch's SIGCHLD handler names the signal.
    small = {"shm_size": 8 << 20}  # the run's /dev/shm evidence: a private tmpfs of 8 MiB
    with_cause = explain(result(exceptions=died(100, BUS_CAUSE), workers=workers(-7, 0), stderr=BUS_LINE,
                                options=small))
    assert with_cause.cause == "shm_exhausted", with_cause
    # forkserver: no SIGCHLD message, only the exit status and the worker's line
    bare = explain(result(exceptions=died(100), workers=workers(-7, 0), stderr=BUS_LINE, options=small))
    assert bare.cause == "shm_exhausted", bare


def test_the_prefix_alone_decides_not_the_errno_text():
    # The same stale errno after another prefix is not shared memory.
    msg = wrapped("RuntimeError", "checksum mismatch: Success (0)")
    d = explain(result(exceptions=[ExceptionInfo("RuntimeError", msg)], workers=workers(0, 0)))
    assert d.cause == "worker_exception", d


# --------------------------------------------------------------------------- /dev/shm files deleted under the loader
TERMINATE = ("terminate called after throwing an instance of 'c10::Error'\n"
             "  what():  could not unlink the shared memory file /torch_100_123_1\n")


def test_a_deleted_shm_file_that_aborts_the_main_process_is_removed_not_full():
    d = explain(result(returncode=-6, exceptions=[], workers=workers(0, 0), stderr=TERMINATE))
    assert d.cause == "shm_exhausted", d
    assert "deleted" in d.summary and "not full" in d.summary, d.summary
    assert any("RemoveIPC" in f.text for f in d.fixes)


def test_opening_a_deleted_shm_file_is_removed_not_full():
    tb = ('Traceback (most recent call last):\n'
          '  File "/v/torch/multiprocessing/reductions.py", line 555, in rebuild_storage_filename\n'
          '    storage = torch.UntypedStorage._new_shared_filename_cpu(manager, handle, size)\nRuntimeError\n')
    msg = "unable to open shared memory object </torch_100_123_2> in read-write mode: No such file or directory (2)"
    d = explain(result(exceptions=[ExceptionInfo("RuntimeError", msg, traceback=tb)], workers=workers(0, 0)))
    assert d.cause == "shm_exhausted" and "deleted" in d.summary, d


def test_a_main_process_abort_without_the_unlink_line_is_not_blamed_on_shm():
    d = explain(result(returncode=-6, exceptions=[], workers=workers(0, 0), stderr="free(): invalid pointer\n"))
    assert d.cause != "shm_exhausted", d


# --------------------------------------------------------------------------- the kernel log, by time too
DMESG = ("[ 1000.250000] Memory cgroup out of memory: Killed process 4242 (pt_data_worker) total-vm:1kB\n"
         "[ 9000.500000] oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/x,task=python,pid=4243,uid=0\n")


def test_a_kernel_log_line_about_an_earlier_process_with_the_same_pid_is_not_evidence():
    """A soak of 01 found oom_killed with high confidence for a SIGKILL it staged: dmesg still held an
    OOM kill of an earlier process numbered like its worker (pids are reused; the log keeps the uptime's)."""
    from labutils.machine.probes import oom_lines_in

    assert oom_lines_in(DMESG, {4242, 4243}) == DMESG.strip().splitlines()  # by number alone: both
    assert oom_lines_in(DMESG, {4242, 4243}, since_boot=5000.0) == [DMESG.splitlines()[1]]  # stamped after
    assert oom_lines_in("Killed process 4242 (python)\n", {4242}, since_boot=0.0) == []  # no stamp: not proven


def test_a_staged_sigkill_is_not_called_memory_by_an_old_kernel_log_line():
    calls = []

    def record(pids, since=None):
        calls.append(since)
        return None if since is not None else {"source": "dmesg", "lines": ["Killed process 100"], "pids": pids}

    r = result(exceptions=died(100, "DataLoader worker (pid 100) is killed by signal: Killed."),
               workers=workers(-9, 0), loader_events=[{**ITER, "t": 5000.0}], wall_time=2.0)
    from labutils.diagnosis import gather

    real = gather.probes.kernel_oom_record
    gather.probes.kernel_oom_record = record
    try:
        d = explain(r)
    finally:
        gather.probes.kernel_oom_record = real
    assert calls and calls[0] == 5000.0 - 2.0 - 1.0, calls
    assert d.cause == "oom_killed" and d.confidence == "low" and "nothing recorded says" in d.summary, d.summary
