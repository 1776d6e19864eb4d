"""Scripts of strangers (tests/corpus): healthy ones that look suspicious, failures outside the loader,
and loader failures the message-matching rules got wrong. Each runs isolated through the diagnose
command (its entry point in this process; the real command line where a test signals the run from
outside); the cause, its confidence and the summary are asserted, and no loader cause may be blamed for a
healthy script or for an error in the model, the checkpoint code or the user's own pickling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from labutils.diagnosis.causes import LOADER_CAUSES

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "corpus")


@pytest.fixture
def diagnose(capsys):
    """``diagnose --json`` on a corpus script, through the command's entry point in this process (the warm
    launcher where it applies; the command line itself is tested in test_diagnose_cli and test_scenarios)."""
    from labutils.commands.diagnose import diagnose_main

    def run(name, *options):
        capsys.readouterr()
        rc = diagnose_main(["--json", "--launcher", "auto", *options, os.path.join(CORPUS, name)])
        out, err = capsys.readouterr()
        assert rc in (0, 1), err
        return json.loads(out)

    return run


def _why(data) -> str:
    return f"{data['cause']} ({data['confidence']}): {data['summary']}\n" + "\n".join(data["evidence"]) \
        + "\n--- stderr\n" + data["stderr"][-2500:]


@pytest.mark.parametrize("name", ["healthy_cuda_warning.py", "healthy_quotes_errors.py"])
def test_healthy_scripts_that_look_suspicious_are_ok(name, diagnose, no_leaks):
    data = diagnose(name)
    assert data["outcome"] == "ok", _why(data)
    assert data["cause"] == "ok" and data["confidence"] == "high", _why(data)
    assert not data["fixes"]


@pytest.mark.parametrize("name, raised", [
    ("save_lambda.py", "local object 'main.<locals>.<lambda>'"),  # 3.13: Can't get, not Can't pickle
    ("load_main_class.py", "Can't get attribute 'Net'"),
    ("model_shape_error.py", "shapes cannot be multiplied"),
    ("own_pickle_fails.py", "cannot pickle '_thread.lock'"),
])
def test_failures_outside_the_loader_blame_no_loader_cause(name, raised, diagnose, no_leaks):
    data = diagnose(name)
    assert data["outcome"] == "failed"
    assert data["cause"] not in LOADER_CAUSES, _why(data)
    assert data["cause"] == "outside_loader" and data["confidence"] == "high", _why(data)
    assert raised in data["summary"] and "not to blame" in data["summary"], _why(data)
    assert any("delivered" in e and "batch" in e for e in data["evidence"]) or name == "load_main_class.py"


def test_fd_leak_in_getitem_is_the_users_leak_not_ipc(diagnose, no_leaks):
    data = diagnose("fd_leak_getitem.py", "--nofile", "64")
    assert data["cause"] == "fd_limit" and data["confidence"] == "high", _why(data)
    assert "your own code" in data["summary"] and "open(" in data["summary"], _why(data)
    texts = " ".join(f["text"] for f in data["fixes"])
    assert "with open(path)" in texts and "set_sharing_strategy" not in texts


def test_catch_and_fallback_is_diagnosed_by_the_original_failure(diagnose, no_leaks):
    data = diagnose("catch_and_fallback.py")
    assert data["outcome"] == "ok" and "falling back" in data["stdout"]
    assert data["cause"] == "unpicklable_dataset", _why(data)
    assert data["recovered"] is True and "your script recovered" in data["summary"]
    assert "num_workers=0" in data["summary"], _why(data)


def test_segfault_with_num_workers_0_is_not_a_dead_worker(diagnose, no_leaks):
    data = diagnose("segfault_single_process.py")
    assert data["signal"] == 11
    assert data["cause"] == "native_crash", _why(data)
    assert "main process" in data["summary"] and "no worker died" in data["summary"], _why(data)
    assert not [w for w in data["workers"] if w["role"] == "dataloader_worker"]


def _signal_a_worker(tmp_path, sig, env_extra=None):
    """Start the slow script under diagnose, SIGKILL/SIGTERM one of its workers from here, return the JSON."""
    notes = tmp_path / "pids"
    notes.mkdir()
    env = dict(os.environ, PID_NOTES=str(notes), **(env_extra or {}))
    proc = subprocess.Popen([PY, "-m", "labutils", "diagnose", "--json", os.path.join(CORPUS, "slow_workers.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 90
        target = None
        while target is None and time.monotonic() < deadline and proc.poll() is None:
            for name in os.listdir(notes):
                pid = int(name)
                try:  # only a process of this test's own run: it carries our PID_NOTES
                    if psutil.Process(pid).environ().get("PID_NOTES") == str(notes):
                        target = pid
                        break
                except (psutil.Error, OSError):
                    continue
            time.sleep(0.1)
        assert target is not None, "no worker of the run wrote its pid"
        time.sleep(0.5)  # a few batches delivered first
        os.kill(target, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode in (0, 1), err
    return json.loads(out), target


def test_kill_9_of_a_worker_from_outside_is_oom_killed_with_low_confidence(tmp_path, no_leaks):
    data, pid = _signal_a_worker(tmp_path, signal.SIGKILL)
    assert any(w["pid"] == pid and w["signal"] == 9 for w in data["workers"]), _why(data)
    assert data["cause"] == "oom_killed" and data["confidence"] == "low", _why(data)
    assert "kill -9" in data["summary"] and "nothing recorded says it was for memory" in data["summary"]
    assert data["memory_limit"] is None


def test_sigterm_from_outside_names_the_likely_sender(tmp_path, no_leaks):
    data, pid = _signal_a_worker(tmp_path, signal.SIGTERM, {"SLURM_JOB_ID": "4242"})
    assert any(w["pid"] == pid and w["signal"] == 15 for w in data["workers"]), _why(data)
    assert data["cause"] == "worker_exit", _why(data)
    assert "SIGTERM from outside" in data["summary"] and "SLURM" in data["summary"], _why(data)
    assert "exited with code" not in data["summary"]


def test_eoferror_at_the_handover_is_an_echo_of_a_worker_exit(diagnose, no_leaks):
    data = diagnose("exit_at_handover.py")
    assert data["outcome"] == "failed"
    assert data["cause"] == "worker_exit", _why(data)
    assert any("EOFError" in e and "an echo" in e for e in data["evidence"]), _why(data)
    assert "killed by signal" not in "\n".join(data["evidence"])
