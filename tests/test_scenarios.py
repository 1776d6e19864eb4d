"""Every cause, on the lab's own scenario scripts: `diagnose --json` names it, warm and cold.

The broken script of each scenario is diagnosed once (``--lab-repeat 3`` for a nightly job: the cause
must not depend on timing), the fixed script once (it must be `ok`); those runs go through the diagnose
command's own entry point in this process, so they start from the warm launcher where it applies, and
each is made once per session (the ``scenario_runs`` fixture of conftest.py: the damaged-record tests of
test_diagnose_provoked read the same runs). Broken scripts are also diagnosed by the real command line
in a fresh process (cold), and the two diagnoses must agree: one cold check for each thing a fresh
interpreter does differently (see ``COLD_CHECKS``). Each run is a real isolated process: a real segfault,
a real SIGKILL under the memory budget (the kernel's OOM killer in a cgroup of the run where the OS allows
it, else the lab's watchdog), a real 8 MiB /dev/shm, a real RLIMIT_NOFILE. Every scenario runs under the
suite's default start method and each extra one the lab's pytest plugin asks for (``lab_start_method``).
"""

import json
import os
import subprocess
import sys

import pytest

from labutils.runner.isolate import private_shm_support
from labutils.scenarios import SCENARIOS

PY = sys.executable

#: Scenarios the warm launcher refuses (a memory budget, a private /dev/shm, a process limit): their run in
#: the scenario test is already a cold launch, so a second cold run would compare cold with cold.
ALWAYS_COLD = [k for k, sc in SCENARIOS.items()
               if sc.broken_options.memory_budget or sc.broken_options.shm_size or sc.broken_options.max_processes]
#: What a fresh interpreter does differently from a child of the warm template, and the scenario that
#: shows each: the lab's records of a worker's exception, exit status and signal (written by the bootstrap,
#: not the template); the script as a real ``__main__`` file that spawn workers import again (and a dataset
#: they unpickle), or a fileless one; the open-files limit and the descriptors a run starts with; the batch
#: counter the stall watch reads, and the threads alive when workers are forked; torch's lazy CUDA state; a
#: failure in the main process. Left out: ``ok`` (the healthy script's cold run through the command line is
#: test_diagnose's test_cli_json_healthy_script) and ``timeout``, whose workers are forked while a thread
#: holds a lock, as in ``hang`` (checked), and whose error, PyTorch's own, is recorded like any exception of
#: the main process (``outside_loader``, checked); its cold run costs 8 s, most of them after the error.
COLD_CHECKS = ["worker_exception", "worker_exit", "native_crash", "missing_main_guard",
               "unpicklable_dataset", "main_not_importable", "fd_limit", "hang", "cuda_in_worker",
               "outside_loader"]


def _torch_has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def diagnose(scenario, which, lab_start_method=None):
    """The real command line in a fresh process; its own default launcher (cold)."""
    opts = scenario.options(which)
    cmd = [PY, "-m", "labutils", "diagnose", "--json", *opts.cli_args(), scenario.path(which)]
    env = dict(os.environ)  # the session's own default start method unless one is given
    if lab_start_method is not None:
        env["LABUTILS_START_METHOD"] = lab_start_method  # the default start method of the run
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.timeout + 120, env=env)
    if done.returncode == 2 and "could not start" in done.stderr:
        pytest.skip(done.stderr.strip())
    assert done.returncode in (0, 1), done.stderr
    data = json.loads(done.stdout)
    assert {"cause", "summary", "evidence", "fixes", "outcome", "exit", "workers"} <= set(data)
    return data


def _skip_if_unsupported(scenario):
    if scenario.broken_options.shm_size or scenario.fixed_options.shm_size:
        prefix, reason = private_shm_support()
        if prefix is None:
            pytest.skip(f"{scenario.id}: a private /dev/shm cannot be mounted here: {reason}")


def _with_gaps(names):
    """The names, each scenario with a known diagnosis gap expected to fail (strictly: it flips when fixed)."""
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=SCENARIOS[n].gap)) if SCENARIOS[n].gap
            else n for n in names]


def test_every_cause_has_a_scenario():
    from labutils.diagnosis.diagnose import CAUSES

    # one scenario named after each cause; the others (the libraries of notebook 13) expect one of the causes
    assert {k for k, sc in SCENARIOS.items() if sc.expected == k} == set(CAUSES)
    assert {sc.expected for sc in SCENARIOS.values()} <= set(CAUSES)
    assert set(COLD_CHECKS) <= set(SCENARIOS) and not set(COLD_CHECKS) & set(ALWAYS_COLD)
    for sc in SCENARIOS.values():
        assert os.path.isfile(sc.path("broken")) and os.path.isfile(sc.path("fixed"))
        assert os.path.isfile(os.path.join(os.path.dirname(__file__), os.pardir, "notebooks", sc.notebook + ".ipynb"))


@pytest.mark.parametrize("cause", _with_gaps(SCENARIOS))
def test_scenario_is_named_and_fixed_is_ok(cause, lab_start_method, lab_repeat, scenario_runs):
    sc = SCENARIOS[cause]
    _skip_if_unsupported(sc)
    runs = 1 if sc.broken == sc.fixed else lab_repeat  # `ok`: broken and fixed are the same healthy script
    if sc.broken != sc.fixed:
        data = scenario_runs.report(sc, "fixed", lab_start_method)
        assert data["cause"] == "ok" and data["outcome"] == "ok", (
            f"{sc.fixed}: {data['cause']}: {data['summary']}\n" + data["stderr"][-2000:])
    for i in range(runs):
        data = scenario_runs.report(sc, "broken", lab_start_method, fresh=i > 0)
        assert data["cause"] == sc.expected, (
            f"run {i + 1}/{runs} of {sc.broken}: got {data['cause']!r}: {data['summary']}\n"
            + "\n".join(data["evidence"]) + "\n--- stderr tail\n" + data["stderr"][-2000:])
        if sc.expected != "ok":
            assert data["fixes"] and all(f["notebook"] for f in data["fixes"])


@pytest.mark.parametrize("cause", COLD_CHECKS)
def test_warm_and_cold_launches_give_the_same_diagnosis(cause, scenario_runs):
    """The real command line in a fresh process (cold) and the warm launcher name the same cause."""
    sc = SCENARIOS[cause]
    _skip_if_unsupported(sc)
    warm = scenario_runs.report(sc, "broken")
    assert warm["launcher"]["kind"] == "warm", warm["launcher"]
    cold = diagnose(sc, "broken")
    assert cold["launcher"]["kind"] == "cold"
    assert cold["cause"] == warm["cause"] == sc.expected, (cold["summary"], warm["summary"])


@pytest.mark.parametrize("cause", ALWAYS_COLD)
def test_a_run_the_warm_launcher_refuses_is_cold_and_says_why(cause, scenario_runs):
    sc = SCENARIOS[cause]
    _skip_if_unsupported(sc)
    launcher = scenario_runs.report(sc, "broken")["launcher"]
    assert launcher["kind"] == "cold" and launcher["why_cold"], launcher


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
def test_launch_scenario_names_the_failing_process(name, lab_start_method, scenario_runs):
    """The loader runs in a child of the script (its workers are grandchildren), or the kernel refuses a
    thread rather than a process: the cause is the one that process met, and the process is named with its
    place in the tree (role, pid, start method); the fixed script is ok."""
    sc = LAUNCH_SCENARIOS[name]
    data = scenario_runs.report(sc, "broken", lab_start_method)
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
    fixed = scenario_runs.report(sc, "fixed", lab_start_method)
    assert fixed["cause"] == "ok" and fixed["outcome"] == "ok", (fixed["summary"], fixed["stderr"][-2000:])
