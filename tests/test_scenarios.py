"""Every cause, on the lab's own scenario scripts: `diagnose --json` names it three runs in a row.

The broken script of each scenario is diagnosed three times (the cause must not depend on timing),
the fixed script once (it must be `ok`). Each run is a real isolated process: a real segfault, a real
SIGKILL under the memory budget (the kernel's OOM killer in a cgroup of the run where the OS allows it,
else the lab's watchdog), a real 8 MiB /dev/shm, a real RLIMIT_NOFILE. Every scenario runs under the
suite's default start method and each extra one the lab's pytest plugin asks for (``lab_start_method``).
"""

import json
import os
import subprocess
import sys

import pytest

from labutils.isolate import private_shm_support
from labutils.tour import SCENARIOS

PY = sys.executable
RUNS = 3


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


def _skip_if_unsupported(scenario):
    if scenario.broken_options.shm_size or scenario.fixed_options.shm_size:
        prefix, reason = private_shm_support()
        if prefix is None:
            pytest.skip(f"{scenario.id}: a private /dev/shm cannot be mounted here: {reason}")


def test_every_cause_has_a_scenario():
    from labutils.diagnose import CAUSES

    assert sorted(SCENARIOS) == sorted(CAUSES)
    for sc in SCENARIOS.values():
        assert sc.expected == sc.id
        assert os.path.isfile(sc.path("broken")) and os.path.isfile(sc.path("fixed"))


@pytest.mark.parametrize("cause", list(SCENARIOS))
def test_scenario_is_named_three_times_and_fixed_is_ok(cause, lab_start_method):
    sc = SCENARIOS[cause]
    _skip_if_unsupported(sc)
    runs = 1 if sc.broken == sc.fixed else RUNS  # `ok`: broken and fixed are the same healthy script
    for i in range(runs):
        data = diagnose(sc, "broken", lab_start_method)
        assert data["cause"] == sc.expected, (
            f"run {i + 1}/{runs} of {sc.broken}: got {data['cause']!r}: {data['summary']}\n"
            + "\n".join(data["evidence"]) + "\n--- stderr tail\n" + data["stderr"][-2000:])
        if sc.expected != "ok":
            assert data["fixes"] and all(f["notebook"] for f in data["fixes"])
    if sc.broken != sc.fixed:
        data = diagnose(sc, "fixed", lab_start_method)
        assert data["cause"] == "ok" and data["outcome"] == "ok", (
            f"{sc.fixed}: {data['cause']}: {data['summary']}\n" + data["stderr"][-2000:])


@pytest.mark.skipif(not _torch_has_cuda(), reason="needs a CUDA GPU: on this CPU-only build `.cuda()` in a "
                    "worker fails with 'Torch not compiled with CUDA enabled' (tested above), not with the "
                    "fork re-initialisation error a GPU machine gives")
def test_cuda_scenario_on_a_gpu_is_the_fork_reinit_error():
    data = diagnose(SCENARIOS["cuda_in_worker"], "broken")
    assert data["cause"] == "cuda_in_worker"
    assert "re-initialize CUDA in forked subprocess" in data["stderr"] + json.dumps(data["exceptions"])
