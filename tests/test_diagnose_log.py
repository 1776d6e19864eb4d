"""Diagnosis from a log's text (``diagnose --log``, ``explain(str)``): logs as people paste them, what a text
can and cannot prove, bad input; and the two run defects found beside it (a re-raised child's message, a
healthy run cut by its time limit)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import traceback

import pytest

from labutils.diagnosis import logread
from labutils.diagnosis.diagnose import explain
from labutils.diagnosis.evidence import printed_chains
from labutils.runner.result import ExceptionInfo, ProcessInfo, RunResult

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOADER = '  File "/opt/conda/lib/python3.10/site-packages/torch/utils/data/dataloader.py", line 1328, in _next_data\n' \
         "    idx, data = self._get_data()\n"


def tb(*lines: str, frames: str = LOADER) -> str:
    return "Traceback (most recent call last):\n" + '  File "train.py", line 40, in <module>\n' \
        "    for batch in loader:\n" + frames + "\n".join(lines) + "\n"


KILLED_SEGV = tb("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Segmentation fault.")
DIED = tb("RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly")
WRAPPED = tb("ValueError: Caught ValueError in DataLoader worker process 0.",
             "Original Traceback (most recent call last):",
             '  File "/x/torch/utils/data/_utils/worker.py", line 308, in _worker_loop',
             "    data = fetcher.fetch(index)",
             '  File "/home/u/data.py", line 12, in __getitem__',
             "    raise ValueError(f'bad row {i}')",
             "ValueError: bad row 7")


def cli(*args, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "labutils", "diagnose", *args], input=stdin, capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


# --------------------------------------------------------------------------- logs as pasted
def test_ansi_colours_tqdm_rewrites_and_rank_prefixes_are_read_through():
    bar = "".join(f"\r{p:3d}%|#####     | {p}/100 [00:01<00:01, 50.0it/s]" for p in range(0, 100, 7))
    text = bar + "\n" + "\n".join(f"[rank1]: \x1b[31m{line}\x1b[0m" for line in KILLED_SEGV.splitlines())
    d = explain(text)
    assert d.cause == "native_crash" and d.source == "log", d
    assert logread.clean_line("[1,3]<stderr>:RuntimeError: x") == "RuntimeError: x"
    assert logread.clean_line("[default0]:  File \"a.py\", line 1, in f") == '  File "a.py", line 1, in f'
    assert logread.clean_line("2024-05-01T10:00:00.123Z E   ValueError: y") == "ValueError: y"


def test_a_worker_exception_under_pytest_e_lines_and_windows_paths():
    text = "\n".join("E   " + line for line in WRAPPED.replace("/home/u/data.py", r"C:\Users\u\data.py")
                     .splitlines())
    d = explain(text)
    assert d.cause == "worker_exception" and "bad row 7" in d.summary, d


def test_spawn_childs_string_frames_and_the_main_attribute_error():
    text = tb("RuntimeError: DataLoader worker (pid(s) 51, 52) exited unexpectedly") + textwrap.dedent("""\
        Traceback (most recent call last):
          File "<string>", line 1, in <module>
          File "C:\\Python311\\Lib\\multiprocessing\\spawn.py", line 122, in spawn_main
            exitcode = _main(fd, parent_sentinel)
          File "C:\\Python311\\Lib\\multiprocessing\\spawn.py", line 132, in _main
            self = reduction.pickle.load(from_parent)
        AttributeError: Can't get attribute 'Rows' on <module '__main__' (built-in)>
        """)
    d = explain(text)
    assert d.cause == "main_not_importable", d


def test_the_primary_failure_outranks_an_echo_printed_before_and_after_it():
    echo = tb("ConnectionResetError: [Errno 104] Connection reset by peer", frames=(
        '  File "/x/torch/multiprocessing/reductions.py", line 541, in rebuild_storage_fd\n'
        "    fd = df.detach()\n"))
    d = explain(echo + "epoch 3 ...\n" + WRAPPED + "\nteardown\n" + DIED)
    assert d.cause == "worker_exception" and "bad row 7" in d.summary, d


def test_an_exception_python_ignored_at_exit_is_never_the_failure():
    """Seen in the lab's own spawn logs (shm_exhausted, oom_killed): after the real failure, multiprocessing's
    exit handler stops a worker still starting, and PyTorch's SIGCHLD handler raises inside its join."""
    shm = tb("RuntimeError: Caught RuntimeError in DataLoader worker process 0.",
             "Original Traceback (most recent call last):",
             '  File "/x/torch/utils/data/_utils/worker.py", line 374, in _worker_loop',
             "    data = fetcher.fetch(index)",
             "RuntimeError: unable to allocate shared memory(shm) for file </torch_10696_3289567388_0>: "
             "No space left on device (28)")
    at_exit = ("Exception ignored in atexit callback: <function _exit_function at 0x7f6e91b9e3e0>\n"
               "Traceback (most recent call last):\n"
               '  File "/usr/lib/python3.11/multiprocessing/util.py", line 357, in _exit_function\n'
               "    p.join()\n"
               '  File "/x/torch/utils/data/_utils/signal_handling.py", line 73, in handler\n'
               "    _error_if_any_worker_fails()\n"
               "RuntimeError: DataLoader worker (pid 10697) is killed by signal: Terminated. \n")
    d = explain(shm + "\n" + at_exit)
    assert d.cause == "shm_exhausted", d
    # alone, it still names what it shows (a kill by SIGTERM), never with more than the text proves
    alone = explain(at_exit)
    assert alone.cause != "shm_exhausted" and alone.confidence != "high", alone


def test_a_traceback_cut_at_the_top_is_still_read():
    cut = KILLED_SEGV.split("\n", 3)[3]  # no header, no first frame
    d = explain("...\n" + cut)
    assert d.cause == "native_crash", d


def test_each_link_of_a_printed_chain_keeps_its_own_separator():
    """A chain printed oldest first, with one "direct cause" and one "During handling" line, read outermost
    first: each link is the separator printed above it (it was read as "cause" for every link)."""
    try:
        try:
            try:
                raise KeyError("a")
            except KeyError:
                raise ValueError("b")  # noqa: B904 - the implicit __context__ is the point
        except ValueError as exc:
            raise RuntimeError("c") from exc
    except RuntimeError as exc:
        text = "".join(traceback.format_exception(exc))
    chain = printed_chains(text)[0][1]
    assert [(e.type, e.link) for e in chain] == [("RuntimeError", None), ("ValueError", "cause"),
                                                 ("KeyError", "context")]


def test_a_dataloader_message_quoted_in_another_exceptions_message():
    text = tb("AssertionError: child process failed: RuntimeError('DataLoader worker (pid 77) is killed by "
              "signal: Segmentation fault. ')", frames='  File "/x/tests/harness.py", line 9, in check\n'
              "    raise AssertionError(msg)\n")
    d = explain(text)
    assert d.cause == "native_crash" and d.confidence != "high", d
    assert any("quoted" in line for line in d.evidence), d.evidence


def test_torchrun_root_cause_block_names_the_rank():
    text = "\n".join(f"[rank1]: {line}" for line in WRAPPED.splitlines()) + textwrap.dedent("""
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        ============================================================
        train.py FAILED
        ------------------------------------------------------------
        Failures:
          <NO_OTHER_FAILURES>
        ------------------------------------------------------------
        Root Cause (first observed failure):
        [0]:
          time      : 2024-05-01_10:00:00
          host      : node1
          rank      : 1 (local_rank: 1)
          exitcode  : 1 (pid: 999)
          error_file: <N/A>
          traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
        ============================================================
        """)
    d = explain(text)
    assert d.cause == "worker_exception" and d.launch["rank"] == 1 and d.source == "log", d


@pytest.mark.parametrize("platform, conf", [
    ("[Mon May  1 10:00:00 2024] Out of memory: Killed process 4242 (pt_data_worker) total-vm:9000kB", "high"),
    ("slurmstepd: error: Detected 1 oom_kill event in StepId=123.batch. Some of your processes may have been "
     "killed by the cgroup out-of-memory handler.", "high"),
    ("    Last State:     Terminated\n      Reason:       OOMKilled\n      Exit Code:    137", "high"),
    ("", "low"),
])
def test_a_sigkill_is_for_memory_only_where_the_platform_says_so(platform, conf):
    text = tb("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.") + platform
    d = explain(text)
    assert d.cause == "oom_killed" and d.confidence == conf, d
    if conf == "low":
        assert "sender unknown" in d.summary and "dmesg" in d.decide_with, d


def test_a_shell_killed_line_alone_is_a_kill_of_the_main_process():
    d = explain("epoch 1\nepoch 2\n./train.sh: line 3: 51234 Killed                  python train.py\n")
    assert d.cause == "oom_killed" and d.confidence == "low" and d.decide_with, d


def test_a_bus_error_cannot_prove_a_full_dev_shm():
    d = explain(tb("RuntimeError: DataLoader worker (pid 12) is killed by signal: Bus error. It is possible that "
                   "dataloader's workers are out of shared memory. Please try to raise your shared memory limit."))
    assert d.cause == "shm_exhausted" and d.confidence == "medium" and d.decide_with == "df -h /dev/shm", d
    full = explain(tb("RuntimeError: unable to allocate shared memory(shm) for file </torch_12_1_0>: "
                      "No space left on device (28)"))
    assert full.cause == "shm_exhausted" and full.confidence == "high", full


def test_no_dataloader_failure_in_a_text_without_one():
    d = explain("Epoch 1: loss 0.3\nUserWarning: This DataLoader will create 8 worker processes in total.\n")
    assert d.cause == "unknown" and d.summary.startswith("no DataLoader failure in this text"), d
    outside = explain(tb("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 5x2)", frames=(
        '  File "/x/torch/nn/modules/linear.py", line 116, in forward\n    return F.linear(input)\n')))
    assert outside.cause == "outside_loader", outside


def test_a_stack_dump_waiting_for_a_batch_is_a_hang_the_text_cannot_time():
    d = explain('Thread 0x7f (most recent call first):\n  File "/x/torch/utils/data/dataloader.py", line 1291 '
                'in _try_get_data\n  File "train.py", line 9 in <module>\n')
    assert d.cause == "hang" and d.confidence == "medium", d


# --------------------------------------------------------------------------- the command and bad input
def test_log_command_reads_files_and_stdin_and_prints_the_runs_json_shape(tmp_path):
    a, b = tmp_path / "job.out", tmp_path / "dmesg.txt"
    a.write_text(tb("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed."))
    b.write_text("Out of memory: Killed process 4242 (pt_data_worker)\n")
    r = cli("--log", str(a), str(b), "--json")
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    assert data["cause"] == "oom_killed" and data["confidence"] == "high" and data["source"] == "log"
    assert {"summary", "evidence", "fixes", "proves", "cannot_prove", "decide_with"} <= set(data)
    r = cli("--log", "-", stdin=WRAPPED)
    assert r.returncode == 1 and "worker_exception" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("make, words", [
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_bytes(b""), "empty"),
    (lambda p: p.write_bytes(bytes(range(256)) * 64), "binary"),
    (lambda p: None, "no such file"),
])
def test_bad_input_is_one_line_never_a_traceback(tmp_path, make, words):
    path = tmp_path / "thing"
    make(path)
    r = cli("--log", str(path))
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_non_utf8_bytes_are_read_and_counted(tmp_path):
    path = tmp_path / "latin1.log"
    path.write_bytes("Datei: M\xfcller\n".encode("latin-1") + KILLED_SEGV.encode())
    r = cli("--log", str(path), "--json")
    data = json.loads(r.stdout)
    assert data["cause"] == "native_crash" and any("not UTF-8" in e for e in data["evidence"]), data


def test_a_big_log_is_streamed_in_chunks_never_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(logread, "CHUNK", 1 << 16)
    path = tmp_path / "big.log"
    filler = ("x" * 99 + "\n").encode() * 20000  # 2 MB of chatter around the failure
    path.write_bytes(filler + DIED.encode() + filler + KILLED_SEGV.encode() + filler[:5000])
    reads = []
    real_open = open

    class Spy:
        def __init__(self, fh):
            self.fh = fh

        def read(self, n=-1):
            assert 0 < n <= 1 << 16, n
            reads.append(n)
            return self.fh.read(n)

        def close(self):
            self.fh.close()

    monkeypatch.setattr(logread, "open", lambda p, mode="r": Spy(real_open(p, mode)), raising=False)
    log = logread.read_logs([str(path)])
    assert len(reads) > 60 and log.bytes_read == path.stat().st_size
    assert len(log.text) < 200_000 and log.bytes_skipped > 3_000_000
    assert explain(log.text).cause == "native_crash"


# --------------------------------------------------------------------------- the two run defects
def test_a_re_raised_childs_message_is_evidence_in_a_run():
    msg = ("child failed: DataLoader worker (pid 4321) is killed by signal: Segmentation fault. ")
    r = RunResult(outcome="failed", returncode=1, exceptions=[ExceptionInfo(
        "RuntimeError", msg, traceback='Traceback (most recent call last):\n  File "/t/harness.py", line 30, in '
        "<module>\n    raise RuntimeError(err)\nRuntimeError: " + msg)],
        workers=[ProcessInfo(pid=4300, role="child", exitcode=1)])
    d = explain(r)
    assert d.cause == "native_crash", d


HARNESS = """
import multiprocessing as mp, os, signal
import torch
from torch.utils.data import DataLoader, Dataset

class Crash(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        os.kill(os.getpid(), signal.SIGSEGV)

def child(q):
    try:
        for _ in DataLoader(Crash(), num_workers=1):
            pass
        q.put(None)
    except Exception as exc:  # PyTorch's own test-suite pattern: send the error back, exit 1
        q.put(f"{exc!r}, caused by {exc.__cause__!r}")
        raise SystemExit(1)

if __name__ == "__main__":
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=child, args=(q,))
    p.start()
    err = q.get(timeout=60)
    p.join()
    if err:
        raise RuntimeError(f"the loader failed in the child: {err}")
"""


def test_a_real_harness_that_re_raises_a_childs_error(tmp_path):
    from labutils.runner.isolate import run_isolated

    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    r = run_isolated(file=str(script), timeout=90, start_method="fork")
    assert r.outcome == "failed" and "Segmentation fault" in r.all_messages, r.stderr[-2000:]
    assert r.cause == "native_crash", r.diagnosis


def test_a_run_cut_by_its_time_limit_while_batches_came_is_cut_short_not_a_hang():
    t0 = 1_000_000.0
    events = [{"event": "iter", "t": t0, "num_workers": 2, "start_method": "fork", "iter": 1}]
    events += [{"event": "progress", "t": t0 + k * 0.09, "batches": 10 * k, "iter": 1} for k in range(1, 66)]
    r = RunResult(outcome="timed_out", returncode=-9, signal=9, reason="no result within 6 s",
                  loader_events=events, options={"timeout": 6.0}, wall_time=7.0,
                  samples=[{"t": t0 + 6.0, "pid": 1, "rss": 1}],
                  workers=[ProcessInfo(pid=11, role="dataloader_worker", exitcode=None)])
    d = explain(r)
    assert d.cause != "hang" and "cut short" in d.summary and "650 batches" in d.summary, d
    stuck = RunResult(outcome="timed_out", returncode=-9, signal=9, reason="no result within 60 s",
                      loader_events=events[:3], options={"timeout": 60.0}, wall_time=61.0,
                      samples=[{"t": t0 + 60.0, "pid": 1, "rss": 1}])
    assert explain(stuck).cause == "hang"  # batches stopped long before the limit: that is one


def test_a_real_healthy_run_cut_by_timeout(tmp_path):
    from labutils.runner.isolate import run_isolated

    script = tmp_path / "long.py"
    script.write_text("import itertools, time, torch\nfrom torch.utils.data import DataLoader\n"
                      "if __name__ == '__main__':\n"
                      "    for epoch in itertools.count():\n"
                      "        for b in DataLoader(list(range(64)), batch_size=4, num_workers=2):\n"
                      "            time.sleep(0.02)\n")
    r = run_isolated(file=str(script), timeout=8, start_method="fork")
    assert r.outcome == "timed_out", r
    assert r.cause != "hang" and "cut short" in r.diagnosis.summary, r.diagnosis


def test_a_sigkill_without_memory_evidence_in_a_run_says_what_it_proves():
    r = RunResult(outcome="failed", returncode=1, exceptions=[ExceptionInfo(
        "RuntimeError", "DataLoader worker (pid(s) 100) exited unexpectedly")],
        loader_events=[{"event": "iter", "num_workers": 1, "start_method": "fork"}],
        workers=[ProcessInfo(pid=100, role="dataloader_worker", exitcode=-signal.SIGKILL)])
    d = explain(r)
    assert d.cause == "oom_killed" and d.confidence == "low", d
    assert "sender unknown" in d.summary and "nothing recorded says it was for memory" in d.summary
    assert d.summary.index("memory first") < d.summary.index("kill -9"), d.summary
    assert d.decide_with and "dmesg" in d.decide_with and "who sent" in d.cannot_prove, d


def test_the_exception_line_after_a_traceback_names_any_class():
    # a class whose name has no Error/Exception ending, bare and with its module path: after a traceback's
    # frames the line is the exception's, whatever it is called (a child's error in a process tree reads so)
    from labutils.diagnosis.evidence import printed_chains

    text = ("Traceback (most recent call last):\n  File \"/w/train.py\", line 3, in <module>\n    go()\n"
            "MyBad: boom\nnoise after it\n"
            "Traceback (most recent call last):\n  File \"/w/train.py\", line 9, in <module>\n    go()\n"
            "pkg.sub.Oops\n")
    chains = printed_chains(text, headless=False)
    assert [(c[0].type, c[0].message) for _i, c in chains] == [("MyBad", "boom"), ("Oops", "")], chains
    # outside a traceback a lone "Word: text" line is not an exception
    assert printed_chains("Epoch: 3 of 10\nloss: 0.25\n") == []
