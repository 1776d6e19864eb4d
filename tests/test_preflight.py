"""``python -m labutils preflight``: its verdicts per notebook, its exit status, its bad options.

Two things are simulated, and said so where they are: a CUDA build of torch (a FAKED torch folder whose
version.py says CUDA, with files of a known size; a GPU present or not by argument) for the torch-build
line; and a machine without a private /dev/shm: an ``unshare`` placed first on PATH
refuses as a container's does ("Operation not permitted", exit 1), so the runner's own probe, which
tries ``unshare``, finds no private mount namespace. The shm reproduction then really runs and is
reported unsupported by the runner; everything else is this machine's real answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import labutils
from labutils.commands import preflight as pf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFUSING_UNSHARE = '#!/bin/sh\necho "unshare: unshare failed: Operation not permitted" >&2\nexit 1\n'


def _preflight(*args, path_first=None, timeout=180):
    env = {**os.environ, "PYTHONPATH": REPO}
    if path_first:
        env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([sys.executable, "-m", "labutils", "preflight", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_without_a_private_dev_shm_notebook_05_shows_recorded_results_and_nothing_fails(tmp_path):
    fake = tmp_path / "unshare"
    fake.write_text(REFUSING_UNSHARE)
    fake.chmod(0o755)
    done = _preflight("--only", "shm_exhausted", "--no-kernel", "--json", path_first=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr  # a lesson shown from recorded results still runs
    report = json.loads(done.stdout)
    build, step = report["steps"]
    assert build["name"] == "torch_build" and build["status"] in ("OK", "WARN"), build
    assert step["name"] == "shm_exhausted" and step["status"] == "SKIP", step
    assert step["data"]["outcome"] == "unsupported", step  # the runner's own verdict on the refused unshare
    assert "Operation not permitted" in step["data"]["reason"], step
    by_name = {v["notebook"]: v for v in report["notebooks"]}
    assert list(by_name) == list(pf.NOTEBOOKS)
    shm = by_name["05_shared_memory"]
    assert shm["level"] == "partly" and shm["text"].startswith("it cannot show a full /dev/shm"), shm
    assert "Operation not permitted" in shm["text"] and shm["text"].endswith(pf.RECORDED), shm
    assert not [v for v in report["notebooks"] if v["level"] == "cannot"], report["notebooks"]


def _ctx(steps, cuda=False, gloo=True):
    return {"doctor": labutils.doctor(), "steps": {s.name: s for s in steps}, "cuda": cuda, "gloo": gloo}


def test_a_family_that_does_not_reproduce_makes_its_lessons_unable_to_run():
    ok = [pf.Step(f, "OK", "", data={"enforced_by": "kernel"}) for f in pf.FAMILIES if f != "native_crash"]
    crash = pf.Step("native_crash", "FAIL", "a segfault in a worker: diagnosed 'worker_exit', expected 'native_crash'")
    found = {v.notebook: v for v in pf.verdicts(_ctx([*ok, crash]))}
    for name in ("00_start_here", "01_read_the_error", "03_corrupt_data"):  # the notebooks that crash a worker
        assert found[name].level == "cannot" and "diagnosed 'worker_exit'" in found[name].text, found[name]
    assert found["04_memory_and_oom"].level == "shows"
    cuda = found["11_cuda_and_accelerators"]
    assert cuda.level == "partly" and "no CUDA" in cuda.text, cuda
    report = pf.PreflightReport(labutils.doctor(), [*ok, crash], list(found.values()), 1.0)
    assert not report.ok


def test_a_watchdog_budget_and_a_missing_gloo_are_said():
    steps = [pf.Step(f, "OK", "", data={"enforced_by": "watchdog" if f == "oom_killed" else None})
             for f in pf.FAMILIES]
    found = {v.notebook: v for v in pf.verdicts(_ctx(steps, cuda=True, gloo=False))}
    assert found["04_memory_and_oom"].level == "partly" and "watchdog" in found["04_memory_and_oom"].text
    assert found["12_distributed_torchrun"].level == "cannot" and "gloo" in found["12_distributed_torchrun"].text
    assert found["11_cuda_and_accelerators"].level == "shows"


def test_no_loopback_tcp_means_notebook_12_cannot_run():
    """SIMULATED verdict (a sandbox that refuses TCP on 127.0.0.1); the probe itself is real below."""
    steps = [pf.Step(f, "OK", "", data={}) for f in pf.FAMILIES]
    ctx = {**_ctx(steps), "loopback": "PermissionError: [Errno 1] Operation not permitted"}
    found = {v.notebook: v for v in pf.verdicts(ctx)}
    assert found["12_distributed_torchrun"].level == "cannot" and "127.0.0.1" in found["12_distributed_torchrun"].text
    assert found["04_memory_and_oom"].level == "shows"


def test_the_loopback_probe_connects_here_and_names_a_refusal(monkeypatch):
    import socket

    assert pf.loopback_tcp() is None

    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(socket, "create_connection", refuse)
    assert pf.loopback_tcp() == "PermissionError: [Errno 1] Operation not permitted"


def test_one_reproduction_and_the_kernel_round_trip_are_real_runs():
    step = pf.reproduce("native_crash")
    assert step.status == "OK" and step.data["cause"] == "native_crash", step
    kernel = pf.kernel_round_trip()
    assert kernel.status == "OK", kernel


def test_bad_options_are_one_clear_line():
    bad = _preflight("--only", "nonsense", timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        f"preflight: argument --only: 'nonsense': give families from {', '.join(pf.FAMILIES)} (comma-separated)"]
    unknown = _preflight("--frobnicate", timeout=60)
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines() == ["preflight: unrecognized arguments: --frobnicate"]


def _fake_torch(tmp_path, version="2.13.0+cu130", cuda="'13.0'", mib=3):
    """A FAKED torch install: site-packages/torch/version.py as the CUDA wheel writes it, with ``mib`` MiB of
    files, and an nvidia/ folder beside it (1 MiB) as the CUDA wheel's dependencies bring."""
    site = tmp_path / "site-packages"
    (site / "torch" / "lib").mkdir(parents=True)
    (site / "torch" / "version.py").write_text(
        f"from typing import Optional\n__version__ = '{version}'\ndebug = False\ncuda: Optional[str] = {cuda}\n")
    (site / "torch" / "lib" / "libtorch_cuda.so").write_bytes(os.urandom(mib * 2**20))
    (site / "nvidia" / "cublas").mkdir(parents=True)
    (site / "nvidia" / "cublas" / "libcublas.so").write_bytes(os.urandom(2**20))
    return str(site / "torch")


def test_a_cuda_build_on_a_machine_without_a_gpu_is_said_with_its_size_and_the_way_out(tmp_path):
    """FAKED torch builds (see _fake_torch); the GPU's presence is given, not probed."""
    torch_dir = _fake_torch(tmp_path)
    step = pf.torch_build(torch_dir, gpu=False)
    assert step.status == "WARN" and "CUDA 13.0 build on a machine with no NVIDIA GPU" in step.detail, step
    assert 3.9 <= step.data["disk_mib"] <= 4.5 and "MiB on disk (torch, nvidia)" in step.detail, step
    assert "torch==2.13.0' --index-url https://download.pytorch.org/whl/cpu" in step.detail, step
    assert pf.torch_build(torch_dir, gpu=True).status == "OK"
    cpu = pf.torch_build(_fake_torch(tmp_path / "cpu", version="2.13.0+cpu", cuda="None"), gpu=False)
    assert cpu.status == "OK" and cpu.detail == "torch 2.13.0+cpu: a CPU build", cpu
    assert pf.torch_build(str(tmp_path / "nowhere")).status == "SKIP"
    report = pf.PreflightReport(labutils.doctor(), [step], [], 1.0)
    assert report.ok or not labutils.doctor().ok, "a WARN does not fail the pre-flight: every lesson still runs"


def test_this_machines_torch_build_is_read_without_importing_it():
    step = pf.torch_build()
    assert step.status in ("OK", "WARN", "SKIP") and "torch" in step.detail, step
