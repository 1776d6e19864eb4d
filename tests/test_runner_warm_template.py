"""The warm template (``runner/warm.py``, ``zygote.py``) seen from a run: when a run may start warm, what a
warm run has as a fresh process would, and a template replaced, discarded or still starting."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from labutils import run_isolated
from labutils.runner import warm as _warm


def test_the_template_kills_a_child_it_cannot_hand_over(tmp_path):
    """SIMULATED in the template only: its pidfd_open fails after the fork; the child must not run on."""
    ours, theirs = socket.socketpair()
    code = ("import os, runpy, sys\n"
            "def refuse(pid, flags=0):\n    raise OSError(38, 'Function not implemented')\n"
            "os.pidfd_open = refuse\nsys.argv = [sys.argv[1], sys.argv[2]]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    z = subprocess.Popen([sys.executable, "-c", code, _warm.ZYGOTE, str(theirs.fileno())],
                         pass_fds=(theirs.fileno(),), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    theirs.close()
    try:
        ours.settimeout(120)
        ours.sendall(b'{"op": "ping"}\n')
        assert b"ok" in ours.recv(4096)
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        out = open(tmp_path / "out", "wb")
        req = json.dumps({"op": "spawn", "run_dir": str(run_dir), "cwd": str(tmp_path), "env": dict(os.environ)})
        socket.send_fds(ours, [req.encode() + b"\n"], [out.fileno(), out.fileno()])
        reply = json.loads(ours.recv(4096))
        out.close()
        assert "error" in reply and "killed and reaped" in reply["error"]
        assert not psutil.pid_exists(reply["pid"])  # killed and reaped: not even a zombie
    finally:
        ours.close()
        z.wait(timeout=30)


def test_a_template_that_does_not_answer_is_discarded(monkeypatch):
    if not _warm.supported():
        pytest.skip("no warm launcher here")
    run_isolated("print(1)")  # a template now exists
    template = _warm._get({k: v for k, v in os.environ.items() if k != "LABUTILS_RUN_DIR"})
    os.kill(template.proc.pid, signal.SIGSTOP)  # a template stuck (in an NFS import, say): no answer comes
    with pytest.raises(OSError, match="did not answer"):
        template.ask({"op": "ping"}, timeout=0.3)
    assert template.poisoned and not template.matches(template.env)
    assert template.proc.poll() is not None  # discarded: killed, never asked again
    r = run_isolated("print(2)")  # a new template serves the next run; no answer is read out of turn
    assert r.ok and r.launcher["kind"] == "warm" and r.stdout.strip() == "2"


def test_env_set_before_import_torch_starts_cold_and_takes_effect():
    cell = ('import os\nos.environ["OMP_NUM_THREADS"] = "1"\nimport torch, labutils\n'
            'labutils.emit(n=torch.get_num_threads())\n')
    r = run_isolated(cell, timeout=60)
    assert r.ok and r.launcher["kind"] == "cold" and "environment variable" in r.launcher["why_cold"]
    assert r.values["n"] == 1
    plain = run_isolated("import torch, os\nos.environ['X'] = '1'\n", timeout=60)
    assert plain.launcher["kind"] == ("warm" if _warm.supported() else "cold")


def test_replacing_the_template_does_not_kill_another_threads_warm_run(monkeypatch):
    """The lab runs in a thread; meanwhile a cell runs after the kernel's environment changed, so the
    template is replaced. The lab's run must finish, not die of the old zygote's exit (PDEATHSIG)."""
    import threading

    from labutils.runner import warm

    first = run_isolated("pass", launcher="warm", timeout=60)  # a template for this environment
    assert first.outcome == "ok", first
    old = warm.template_pid()
    got = {}
    lab = threading.Thread(target=lambda: got.update(r=run_isolated(
        "import time, labutils\ntime.sleep(2.5)\nlabutils.emit(done=True)", launcher="warm", timeout=60)))
    lab.start()
    time.sleep(1.0)  # the lab's run is in flight
    monkeypatch.setenv("LABUTILS_TEST_NEW_TEMPLATE", "1")  # any variable an import might read
    cell = run_isolated("pass", launcher="warm", timeout=60)
    lab.join(60)
    assert cell.outcome == "ok" and warm.template_pid() != old, cell
    r = got["r"]
    assert r.outcome == "ok" and r.values.get("done"), r
    assert not os.path.exists(f"/proc/{old}") or open(f"/proc/{old}/stat").read().split()[2] == "Z", \
        "the replaced template was not closed once idle"
    monkeypatch.delenv("LABUTILS_TEST_NEW_TEMPLATE")
    warm.shutdown()


SLOW_ZYGOTE = """import runpy, sys, time
time.sleep({delay})
sys.argv = [{real!r}] + sys.argv[1:]
runpy.run_path({real!r}, run_name="__main__")
"""


def test_a_template_still_starting_does_not_take_the_runs_time(tmp_path, monkeypatch):
    """SIMULATED slow start (an NFS import of torch, a busy machine): the template's script sleeps 8 s
    first. A run with a 5 s timeout must not spend it waiting: it starts cold and finishes, and the
    template, left to start, serves the next run warm."""
    from labutils.runner import warm

    warm.shutdown()
    slow = tmp_path / "slow_zygote.py"
    slow.write_text(SLOW_ZYGOTE.format(delay=8, real=warm.ZYGOTE))
    monkeypatch.setattr(warm, "ZYGOTE", str(slow))
    try:
        r = run_isolated("print('done')", timeout=5)
        assert r.outcome == "ok" and r.stdout.strip() == "done", (r.outcome, r.launcher, r.stderr)
        assert r.launcher["kind"] == "cold" and "still starting" in r.launcher["why_cold"], r.launcher
        assert r.wall_time < 5, r.wall_time
        pid = warm.template_pid()
        assert pid is not None, "the template was discarded instead of left to start"
        nxt = run_isolated("print('warm')", timeout=60)
        assert nxt.outcome == "ok" and nxt.launcher["kind"] == "warm", nxt.launcher
        assert warm.template_pid() == pid and nxt.wall_time < 5, nxt.wall_time  # its start is not the run's time
    finally:
        warm.shutdown()


UMASK = "import os\nm = os.umask(0)\nos.umask(m)\nprint(oct(m))"


def test_a_changed_umask_gives_a_warm_run_the_kernels_new_umask():
    """A fresh process inherits the runner's umask now; the template's is that of its start."""
    from labutils.runner import warm

    first = run_isolated(UMASK, launcher="warm", timeout=60)
    old = os.umask(0o027)
    try:
        r = run_isolated(UMASK, launcher="warm", timeout=60)
    finally:
        os.umask(old)
    assert first.outcome == r.outcome == "ok", (first.stderr, r.stderr)
    assert r.stdout.strip() == "0o27" and first.stdout.strip() == oct(old), (first.stdout, r.stdout)
    assert r.launcher["kind"] == "warm", r.launcher
    warm.shutdown()


def test_an_install_into_site_packages_replaces_the_template(tmp_path, monkeypatch):
    """SIMULATED ``%pip install``: a directory standing for site-packages gets a new ``*.dist-info``, as an
    install does (the real ones are in the stamp list too, with torch's and numpy's ``__init__.py``)."""
    from labutils.runner import warm

    real = warm.package_dirs()
    assert any(p.endswith(os.path.join("torch", "__init__.py")) for p in real), real
    assert any(os.path.basename(p) in ("site-packages", "dist-packages") for p in real), real
    # the template compiles the bootstrap once for all its runs: an edited bootstrap must replace it too
    assert any(p.endswith(os.path.join("runner", "bootstrap.py")) for p in real), real
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(warm, "_packages", [*real, str(site)])
    assert run_isolated("pass", launcher="warm", timeout=60).outcome == "ok"
    before = warm.template_pid()
    assert run_isolated("pass", launcher="warm", timeout=60).outcome == "ok"
    assert warm.template_pid() == before  # nothing changed: the same template
    stamp = os.stat(site).st_mtime_ns
    (site / "newpkg-1.0.dist-info").mkdir()
    os.utime(site, ns=(stamp + 10**9, stamp + 10**9))  # a coarse-clock filesystem still sees the change
    r = run_isolated("pass", launcher="warm", timeout=60)
    assert r.outcome == "ok" and r.launcher["kind"] == "warm" and warm.template_pid() != before, r.launcher
    warm.shutdown()


USS = "import torch, psutil, labutils\nlabutils.emit(uss=psutil.Process().memory_full_info().uss)"


def test_a_run_with_a_sample_listener_is_cold_so_its_uss_is_a_fresh_processes():
    """The live chart plots USS from on_sample; a warm main process shares torch's pages with the template
    and shows far less. Measured both ways: the warm figure is lower, and an on_sample run goes cold."""
    warm_run = run_isolated(USS, launcher="warm", timeout=60)
    charted = run_isolated(USS, on_sample=lambda sample: None, timeout=60)
    assert warm_run.launcher["kind"] == "warm", warm_run.launcher
    assert charted.launcher["kind"] == "cold" and "on_sample" in charted.launcher["why_cold"], charted.launcher
    assert charted.values["uss"] > warm_run.values["uss"] + 50 * 2**20, (charted.values, warm_run.values)
