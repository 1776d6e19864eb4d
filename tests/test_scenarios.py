"""Every cause, on the lab's own scenario scripts: `diagnose --json` names it, warm and cold.

The broken script of each scenario is diagnosed once (``--lab-repeat 3`` for a nightly job: the cause
must not depend on timing), the fixed script once (it must be `ok`); those runs go through the diagnose
command's own entry point in this process, so they start from the warm launcher where it applies. Each
broken script is also diagnosed by the real command line in a fresh process (cold), and the two
diagnoses must agree. Each run is a real isolated process: a real segfault, a real
SIGKILL under the memory budget (the kernel's OOM killer in a cgroup of the run where the OS allows it,
else the lab's watchdog), a real 8 MiB /dev/shm, a real RLIMIT_NOFILE. Every scenario runs under the
suite's default start method and each extra one the lab's pytest plugin asks for (``lab_start_method``).
"""

import json
import os
import subprocess
import sys

import pytest

from labutils.lab.tour import SCENARIOS
from labutils.runner.isolate import private_shm_support

PY = sys.executable
_RUNS: dict = {}  # (cause, which, start method) -> the first warm diagnosis: shared by the tests below


def _torch_has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def diagnose(scenario, which, lab_start_method=None):
    opts = scenario.options(which)
    cmd = [PY, "-m", "labutils", "diagnose", "--json", *opts.cli_args(), scenario.path(which)]
    env = dict(os.environ)
    if lab_start_method is not None:
        env["LABUTILS_START_METHOD"] = lab_start_method  # the default start method of the run
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.timeout + 120, env=env)
    if done.returncode == 2 and "could not start" in done.stderr:
        pytest.skip(done.stderr.strip())
    assert done.returncode in (0, 1), done.stderr
    data = json.loads(done.stdout)
    assert {"cause", "summary", "evidence", "fixes", "outcome", "exit", "workers"} <= set(data)
    return data


def diagnose_here(scenario, which, lab_start_method, monkeypatch, capsys, cache=True):
    """The diagnose command's entry point in this process (``--launcher auto``: the warm launcher)."""
    from labutils.diagnosis.cli import diagnose_main

    key = (scenario.id, which, lab_start_method)
    if cache and key in _RUNS:
        return _RUNS[key]
    opts = scenario.options(which)
    with monkeypatch.context() as m:
        if lab_start_method is not None:
            m.setenv("LABUTILS_START_METHOD", lab_start_method)
        else:
            m.delenv("LABUTILS_START_METHOD", raising=False)
        capsys.readouterr()
        rc = diagnose_main(["--json", "--launcher", "auto", *opts.cli_args(), scenario.path(which)])
        out, err = capsys.readouterr()
    if rc == 2 and "could not start" in err:
        pytest.skip(err.strip())
    assert rc in (0, 1), err
    data = json.loads(out)
    _RUNS.setdefault(key, data)
    return data


def _skip_if_unsupported(scenario):
    if scenario.broken_options.shm_size or scenario.fixed_options.shm_size:
        prefix, reason = private_shm_support()
        if prefix is None:
            pytest.skip(f"{scenario.id}: a private /dev/shm cannot be mounted here: {reason}")


def test_every_cause_has_a_scenario():
    from labutils.diagnosis.diagnose import CAUSES

    assert sorted(SCENARIOS) == sorted(CAUSES)
    for sc in SCENARIOS.values():
        assert sc.expected == sc.id
        assert os.path.isfile(sc.path("broken")) and os.path.isfile(sc.path("fixed"))


@pytest.mark.parametrize("cause", list(SCENARIOS))
def test_scenario_is_named_and_fixed_is_ok(cause, lab_start_method, lab_repeat, monkeypatch, capsys):
    sc = SCENARIOS[cause]
    _skip_if_unsupported(sc)
    runs = 1 if sc.broken == sc.fixed else lab_repeat  # `ok`: broken and fixed are the same healthy script
    for i in range(runs):
        data = diagnose_here(sc, "broken", lab_start_method, monkeypatch, capsys, cache=i == 0)
        assert data["cause"] == sc.expected, (
            f"run {i + 1}/{runs} of {sc.broken}: got {data['cause']!r}: {data['summary']}\n"
            + "\n".join(data["evidence"]) + "\n--- stderr tail\n" + data["stderr"][-2000:])
        if sc.expected != "ok":
            assert data["fixes"] and all(f["notebook"] for f in data["fixes"])
    if sc.broken != sc.fixed:
        data = diagnose_here(sc, "fixed", lab_start_method, monkeypatch, capsys)
        assert data["cause"] == "ok" and data["outcome"] == "ok", (
            f"{sc.fixed}: {data['cause']}: {data['summary']}\n" + data["stderr"][-2000:])


@pytest.mark.parametrize("cause", list(SCENARIOS))
def test_warm_and_cold_launches_give_the_same_diagnosis(cause, monkeypatch, capsys):
    """The real command line in a fresh process (cold) and the warm launcher name the same cause."""
    sc = SCENARIOS[cause]
    _skip_if_unsupported(sc)
    cold = diagnose(sc, "broken")
    warm = diagnose_here(sc, "broken", None, monkeypatch, capsys)
    assert cold["launcher"]["kind"] == "cold"
    opts = sc.broken_options
    if opts.memory_budget or opts.shm_size or getattr(opts, "max_processes", None):  # cold, and it says why
        assert warm["launcher"]["kind"] == "cold" and warm["launcher"]["why_cold"], warm["launcher"]
    else:
        assert warm["launcher"]["kind"] == "warm", warm["launcher"]
    assert cold["cause"] == warm["cause"] == sc.expected, (cold["summary"], warm["summary"])


@pytest.mark.skipif(not _torch_has_cuda(), reason="needs a CUDA GPU: on this CPU-only build `.cuda()` in a "
                    "worker fails with 'Torch not compiled with CUDA enabled' (tested above), not with the "
                    "fork re-initialisation error a GPU machine gives")
def test_cuda_scenario_on_a_gpu_is_the_fork_reinit_error():
    data = diagnose(SCENARIOS["cuda_in_worker"], "broken")
    assert data["cause"] == "cuda_in_worker"
    assert "re-initialize CUDA in forked subprocess" in data["stderr"] + json.dumps(data["exceptions"])


# --------------------------------------------------------------------------- where the loader ran, what was refused
from labutils.scenarios import LAUNCH_SCENARIOS  # noqa: E402


@pytest.mark.parametrize("name", list(LAUNCH_SCENARIOS))
def test_launch_scenario_names_the_failing_process(name, lab_start_method, monkeypatch, capsys):
    """The loader runs in a child of the script (its workers are grandchildren), or the kernel refuses a
    thread rather than a process: the cause is the one that process met, and the process is named with its
    place in the tree (role, pid, start method); the fixed script is ok."""
    sc = LAUNCH_SCENARIOS[name]
    data = diagnose_here(sc, "broken", lab_start_method, monkeypatch, capsys)
    detail = (f"{sc.broken}: got {data['cause']!r} ({data['confidence']}): {data['summary']}\n"
              + "\n".join(data["evidence"]) + "\n--- stderr tail\n" + data["stderr"][-2500:])
    assert data["cause"] == sc.expected, detail
    proc = data.get("process")
    assert proc, detail
    if sc.failing == "child":
        assert proc["role"] == "child" and proc["parent"] == "main", proc
        assert proc["pid"] in {w["pid"] for w in data["workers"] if w["role"] == "process"}, (proc, data["workers"])
        assert proc["start_method"] in ("fork", "spawn", "forkserver"), proc
        assert str(proc["pid"]) in data["summary"], data["summary"]
    else:  # the thread refusal: in a worker (its feeder or a read thread) or the main process
        assert proc["role"] in ("worker", "main"), proc
    if sc.id == "tree_mp_spawn":
        assert proc["via"] == "ProcessRaisedException" and proc["start_method"] == "spawn", proc
    if sc.id == "tree_pool":
        assert proc["via"] == "_RemoteTraceback", proc
    if sc.id == "tree_exit0":
        assert data["outcome"] == "ok" and data["returncode"] == 0  # the script hid its child's failure
        assert "Caught RuntimeError in DataLoader worker process 1" in data["stderr"]
    if sc.id == "thread_refused":
        assert "can't start new thread" in data["stderr"] and data["options"]["max_processes"] == 18
    fixed = diagnose_here(sc, "fixed", lab_start_method, monkeypatch, capsys)
    assert fixed["cause"] == "ok" and fixed["outcome"] == "ok", (fixed["summary"], fixed["stderr"][-2000:])
