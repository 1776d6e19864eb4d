"""torchrun launches: the diagnosis names the first failed rank and the cause, from real launches.

Three launches: a segfault in a worker of rank 1 (through the command line), an exception on rank 0 under
``@record`` and a healthy launch (through :func:`run_torchrun`). Each launch is ``torch.distributed.run``
with 2 CPU ranks (gloo, a local rendezvous on a free port) and 2 DataLoader workers per rank, run isolated;
a launch costs about 5-9 s on the 2-core machine.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from labutils.diagnosis.diagnose import rank_output, torchrun_failures
from labutils.runner.torchrun import run_torchrun, torchrun_argv

TRAIN = textwrap.dedent("""
    import ctypes, os, sys
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    CRASH = os.environ.get("CRASH", "")
    CRASH_RANK = os.environ.get("CRASH_RANK", "1")


    class Samples(Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            if os.environ["RANK"] == CRASH_RANK and i == 8:
                if CRASH == "segv":
                    ctypes.string_at(0)  # a native crash, as in a broken decoder
                if CRASH == "exc":
                    raise ValueError(f"bad sample {i}")
            return torch.full((4,), float(i))


    def main():
        dist.init_process_group("gloo")
        loader = DataLoader(Samples(), batch_size=4, num_workers=2)
        seen = torch.tensor([sum(b.shape[0] for b in loader)])
        dist.all_reduce(seen)
        print(f"rank {dist.get_rank()} samples {seen.item()}", flush=True)
        dist.destroy_process_group()


    if os.environ.get("RECORD"):
        from torch.distributed.elastic.multiprocessing.errors import record
        main = record(main)

    if __name__ == "__main__":
        main()
""")

BLOCK = """
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_12:25:36
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 2186) (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 2186
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_12:25:36
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 2187)
  error_file: /tmp/torchelastic_x/attempt_0/1/error.json
  traceback : Traceback (most recent call last):
    File "train.py", line 9, in main
      raise ValueError("bad")
  ValueError: bad
============================================================"""


@pytest.fixture
def train(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


def test_the_root_cause_block_is_parsed_root_first():
    failures = torchrun_failures(BLOCK)
    assert [f["rank"] for f in failures] == [1, 0]
    root, peer = failures
    assert root["root"] and root["exitcode"] == 1 and root["pid"] == 2187 and root["local_rank"] == 1
    assert root["error_file"].endswith("error.json") and root["traceback"].splitlines()[-1] == "ValueError: bad"
    assert not peer["root"] and peer["exitcode"] == -15 and peer["signal"] == "SIGTERM"
    assert peer["error_file"] is None


def test_no_block_no_failures():
    assert torchrun_failures("RuntimeError: DataLoader worker (pid(s) 1) exited unexpectedly") == []


def test_rank_output_keeps_one_rank_without_its_prefix():
    text = "[rank0]: Traceback (most recent call last):\n[rank1]:   File \"x\"\nplain\n[rank0]: KeyError: 'a'"
    assert rank_output(text, 0) == "Traceback (most recent call last):\nKeyError: 'a'"
    assert rank_output(text, 1) == "  File \"x\"" and rank_output(text, 2) == ""


def test_argv_is_a_local_standalone_launch():
    argv = torchrun_argv("t.py", ["--x", 1], nproc_per_node=2, max_restarts=1)
    assert argv[0] == "--standalone" and argv[-3:] == ["t.py", "--x", "1"]
    assert argv[argv.index("--nproc-per-node") + 1] == "2" and argv[argv.index("--max-restarts") + 1] == "1"
    with pytest.raises(ValueError, match="at least 1"):
        torchrun_argv("t.py", nproc_per_node=0)


def test_record_gives_an_error_file_and_the_cause_on_rank_0(train, no_leaks):
    result = run_torchrun(train, nproc_per_node=2, timeout=90,
                          env={"CRASH": "exc", "CRASH_RANK": "0", "RECORD": "1"})
    d = result.diagnosis
    assert d.cause == "worker_exception", d
    assert d.launch["rank"] == 0 and d.launch["error_file"], d.launch
    assert "bad sample 8" in d.summary


def test_a_healthy_launch_is_ok(train, no_leaks):
    result = run_torchrun(train, nproc_per_node=2, timeout=90)
    assert result.outcome == "ok" and result.diagnosis.cause == "ok", result.stderr[-2000:]
    assert result.stdout.count("samples 128") == 2
    # the launcher made no loader itself; its ranks' workers ended under the run's watch (notebook 12's cards)
    assert "it created no DataLoader iterator" not in result.diagnosis.summary, result.diagnosis.summary
    assert "ran in processes it started" in result.diagnosis.summary, result.diagnosis.summary


def labutils(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "labutils", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_a_segfault_in_a_worker_of_rank_1_is_native_crash_on_rank_1(train, no_leaks):
    """The real command line (``diagnose --json --torchrun``): one launch, rank 1's worker segfaults."""
    # --max-restarts is exercised by notebook 12; with this script, a restart once hung until --timeout
    # (diagnosed as a hang), not understood yet: see the branch report
    done = labutils("diagnose", "--json", "--timeout", "90", "--torchrun", "--nproc-per-node", "2",
                    str(train), env={"CRASH": "segv", "CRASH_RANK": "1"}, timeout=180)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["outcome"] == "failed" and report["exceptions"][-1]["type"] == "ChildFailedError", report
    assert report["cause"] == "native_crash", report["summary"]
    launch = report["launch"]
    assert launch["rank"] == 1 and launch["launcher"] == "torchrun", launch
    assert "rank 1" in report["summary"] and any("segmentation fault" in e.lower() for e in report["evidence"])
    others = [f for f in launch["failures"] if f["rank"] == 0]  # the peer torchrun stopped, or that gave up
    assert others and (others[0]["signal"] == "SIGTERM" or others[0]["exitcode"] == 1), launch["failures"]
    assert len(re.findall(r"failed \(exitcode: -?\d+\) local_rank: \d+", report["stderr"])) == 1


@pytest.mark.parametrize("args, text", [
    (["--nproc-per-node", "2"], "add --torchrun"),
    (["--torchrun", "--nproc-per-node", "0"], "at least 1"),
    (["--torchrun", "--stall", "5"], "--timeout"),
    (["--torchrun", "--stdin-main"], "--stdin-main"),
])
def test_cli_torchrun_usage_errors_are_one_line(train, args, text):
    done = labutils("diagnose", *args, str(train))
    assert done.returncode == 2 and text in done.stderr and "Traceback" not in done.stderr, done.stderr
