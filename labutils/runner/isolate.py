"""Run learner code in a fresh Python process, under per-run limits, and collect the evidence.

The Jupyter kernel only starts a child process and watches it: a segfault, an OOM kill, a hang or fd
exhaustion in the learner's loader ends that child, never the kernel. The machine may be shared (a
JupyterHub, a laptop beside real work): after every run the runner kills only the processes it can prove
are the run's (``procs``) and removes only the /dev/shm files the run created (``ownership``).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

from . import capabilities as _caps
from . import cgroup as _cgroup
from . import evidence as _evidence
from . import ownership as _ownership
from . import procs as _procs
from . import rundir as _rd
from . import warm as _warm
from .group import RunGroup
from .monitor import Monitor, _dump_stacks
from .result import RunResult
from .sizes import format_size
from .spec import IsolationError, RunSpec, _cell_bytes, takes_run_options

_BOOTSTRAP = str(Path(__file__).with_name("bootstrap.py"))
_CHILD = str(Path(__file__).with_name("child.py"))
_SHM = "/dev/shm"

#: set to ``(None, reason)`` to refuse private mounts in this process (``shmwatch.refuse_private_mounts``)
_shm_support: Optional[tuple] = None


def private_shm_support() -> tuple:
    """``(argv_prefix, None)`` if a private /dev/shm can be mounted for a run, else ``(None, reason)``."""
    if _shm_support is not None:
        return _shm_support
    cap = _caps.private_shm()
    return (list(cap.detail["prefix"]), None) if cap.available else (None, cap.result)


@takes_run_options
def run_isolated(code: Optional[str] = None, **options) -> RunResult:
    """Run learner code in a fresh Python process and return what happened as a :class:`RunResult`.

    Give exactly one of ``code`` (the text of a cell; it is written to a real module file and run like
    ``python lab_cell.py``), ``file`` (a script, run unchanged with ``argv``) or ``func`` (a module-level
    callable or ``"module:function"``, called with ``args``/``kwargs``; its JSON-able return value is kept).

    Every limit applies to this run only (each keyword is listed below, from the table in ``spec``);
    a bad value is refused before anything starts, with one line naming it.

    For a live view, ``on_sample(dict)`` is called from the monitor thread for every process at least four
    times a second with ``t``, ``pid``, ``role`` (main / worker / other), ``name``, ``rss``, ``uss``, ``fds``,
    ``shm_bytes`` and ``batches`` (and once more after the run, ``final=True`` with no memory figures, when
    batches came after the main process's last sample), and ``on_event(dict)`` for each process death seen
    (``exitcode`` or ``signal``, and ``by``: watchdog, kernel_oom or None). Either may raise
    :class:`StopRun` to end the run at once.

    Only the run's own processes are ever signalled and only /dev/shm files the run created are removed.
    """
    spec = RunSpec.build(code, **options)
    return _run(spec)


def _run(spec: RunSpec) -> RunResult:
    options = spec.options()
    prefix: list = []
    if spec.shm_size is not None:
        prefix, reason = private_shm_support()
        if prefix is None:
            return RunResult(outcome="unsupported", reason=f"shm_size={format_size(spec.shm_size)}: {reason}",
                             options=options)
    why_cold = _warm.refusal(spec.launcher, env=spec.env, prefix=prefix, budget=spec.memory_budget,
                             detail=spec.memory_detail or spec.on_sample is not None, python=spec.python,
                             process_limit=spec.max_processes is not None, source=_source(spec))
    if spec.launcher == "warm" and why_cold is not None:
        raise IsolationError(f"launcher='warm' is not possible for this run: {why_cold}; use 'auto'")
    _ownership.clean_after_dead_runners()
    run_dir = _ownership.make_run_dir()
    group = RunGroup()
    try:
        group = RunGroup.prepare(spec.memory_budget, spec.memory_enforcement, spec.max_processes)
        if group.refusal is not None:
            return RunResult(outcome="unsupported", options=options, reason=group.refusal)
        if group.process_limit is not None:
            options["process_limit"] = group.process_limit
        cfg = _write_config(spec, run_dir, group)
        result = _execute(run_dir, cfg, spec, options, prefix, group, why_cold)
        group.refused_forks()  # the kernel's count of refused forks, read before the group goes
    finally:
        group.remove()
        _ownership.remove_run_dir(run_dir)
    result.leftover_cgroups = list(group.leftover)
    return result


def _source(spec: RunSpec) -> Optional[str]:
    """The learner's code, for the warm launcher's check of what it does before ``import torch``."""
    if spec.code is not None:
        return spec.code
    if spec.file is not None:
        try:
            with open(spec.file, encoding="utf-8", errors="replace") as fh:
                return fh.read(1 << 20)
        except OSError:
            return None
    return None


def _write_config(spec: RunSpec, run_dir: str, group: RunGroup) -> dict:
    cfg: dict = {"start_method": spec.start_method, "nofile": spec.nofile, "argv": list(spec.argv)}
    mode = "notebook_main" if spec.notebook_main else "file"
    if spec.code is not None:
        path = os.path.join(run_dir, _rd.CELL)
        with open(path, "wb") as fh:
            fh.write(_cell_bytes(spec.code))
        cfg.update(mode=mode, path=path)
    elif spec.file is not None:
        cfg.update(mode=mode, path=spec.file)
    else:
        module, qualname, _src = spec.func
        cfg.update(mode="func", module=module, qualname=qualname, args=spec.args, kwargs=spec.kwargs,
                   sys_path0=os.getcwd())
    cfg.update(group.config())
    os.mkdir(os.path.join(run_dir, _rd.PY))
    shutil.copyfile(_CHILD, os.path.join(run_dir, _rd.PY, _rd.CHILD_MODULE + ".py"))
    with open(os.path.join(run_dir, _rd.CONFIG), "w", encoding="utf-8") as fh:
        json.dump(cfg, fh)
    return cfg


def _wait_leader(proc, pidfd, wake_r, deadline, monitor) -> str:
    """Wait without reaping: "exited", "stalled", "output" (past the output limit) or "timeout"."""
    poller = select.poll()  # not select(): a kernel with more than 1023 fds open gets fd numbers above it
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return "timeout"
        if pidfd is not None:
            ready = {fd for fd, _ev in poller.poll(None if remaining is None else max(1, int(remaining * 1000)))}
            if pidfd in ready:
                return "exited"
            if wake_r in ready:
                os.read(wake_r, 64)
        else:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return "exited"
            time.sleep(0.02 if remaining is None else min(0.02, remaining))
        if monitor.stalled is not None:
            return "stalled"
        if monitor.overflow_of is not None:
            return "output"
        if monitor.failed_closed:
            return "monitor"
        if monitor.stop_requested is not None:
            return "asked"


def _close_fds(*fds) -> None:
    for fd in fds:
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def _command(spec: RunSpec, run_dir: str, prefix: list, group: RunGroup) -> list:
    cmd = [spec.python, _BOOTSTRAP, run_dir]
    if prefix:
        mount = f"mount -t tmpfs -o size={spec.shm_size},mode=1777 tmpfs {_SHM} && exec \"$@\""
        cmd = [*prefix, "sh", "-c", mount, "sh", *cmd]
    return [*group.prefix, *cmd]


def _child_env(spec: RunSpec, run_dir: str) -> dict:
    env = dict(os.environ)
    env.update(spec.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["LABUTILS_RUN_DIR"] = run_dir
    env[_warm.RUNNER_ENV] = _warm.runner_mark()
    tmp = _ownership.run_temp_dir(run_dir)
    if tmp is not None and not any(name in spec.env for name in _rd.TMP_VARS):  # a learner's own TMPDIR wins
        env.update(dict.fromkeys(_rd.TMP_VARS, tmp))
    return env


def _launch(spec: RunSpec, run_dir: str, cmd: list, env: dict, why_cold: Optional[str]) -> tuple:
    """Start the run (warm where it may, else cold): ``(process, why_cold)``. A template still starting is
    waited for at most the run's timeout (a launcher='warm' run waits for it in full)."""
    out_path, err_path = os.path.join(run_dir, _rd.STDOUT), os.path.join(run_dir, _rd.STDERR)
    proc = None
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        if why_cold is None:
            wait = None if spec.launcher == "warm" else spec.timeout
            try:
                proc = _warm.spawn(env, run_dir, spec.cwd, out, err, wait=wait)
            except _warm.NotReady as exc:
                why_cold = f"{exc}, longer than the run's timeout, so this run started cold"
            except OSError as exc:
                if spec.launcher == "warm":
                    raise IsolationError(f"the warm launcher failed: {exc}; use launcher='auto'") from None
                why_cold = f"the warm template failed ({exc}), so this run started cold"
        if proc is None:
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                        cwd=spec.cwd, start_new_session=True)
            except OSError as exc:
                raise IsolationError(f"could not start the run's Python ({cmd[0]}): {exc.strerror or exc}") from None
    return proc, why_cold


def _leader_pidfd(proc) -> Optional[int]:
    if isinstance(proc, _warm.WarmProcess):
        return proc.pidfd  # from the template, which reaps the process only when told to
    if not _caps.has_pidfd():
        return None
    try:
        return os.pidfd_open(proc.pid)  # our child, not reaped: certainly this process
    except OSError:
        return None


class _Run:
    """What one run's supervision gathered, for the evidence."""

    def __init__(self, spec, cfg, options, run_dir, group):
        self.spec, self.cfg, self.options, self.run_dir, self.group = spec, cfg, options, run_dir, group
        self.proc = self.procs = self.monitor = None
        self.kmsg = self.pidfd = None
        self.wake = (None, None)
        self.stacks: dict = {}
        self.wall = 0.0
        self.launcher: Optional[dict] = None
        self.kernel_record = None
        self.ticks: dict = {}
        self.left, self.removed, self.leftover, self.created = [], [], [], []
        self.processes_seen = 0

    def abandon(self) -> None:
        """An exception (a KeyboardInterrupt in the kernel) mid-run: still leave nothing behind."""
        if self.monitor is not None:
            self.monitor.stop.set()
            self.monitor.join(timeout=5)
        if self.procs is not None:
            self.procs.terminate(helper_grace=0.5)
        if self.proc is not None:
            self.proc.wait()
        if self.procs is not None:
            self.procs.close()
        _close_fds(self.kmsg)


def _execute(run_dir, cfg, spec, options, prefix, group, why_cold) -> RunResult:
    run = _Run(spec, cfg, options, run_dir, group)
    cmd, env = _command(spec, run_dir, prefix, group), _child_env(spec, run_dir)
    shm_before = _ownership.shm_entries()
    try:  # from the first fd on: whatever fails, no fd and no process is left
        run.kmsg = _cgroup.kernel_log_reader() if group.memory is not None else None
        run.wake = os.pipe()
        run.proc, why_cold = _launch(spec, run_dir, cmd, env, why_cold)
        t0 = time.monotonic()  # the run's time starts with its process, not with a template still starting
        deadline = None if spec.timeout is None else t0 + spec.timeout
        run.launcher = {"kind": "cold" if why_cold else "warm", "why_cold": why_cold,
                        "tracking": "pidfd" if _caps.has_pidfd() else "pid and start time (no pidfds here)"}
        run.pidfd = _leader_pidfd(run.proc)
        cg = group.memory
        run.procs = _procs.RunProcesses(run_dir, run.proc.pid, cgroup=cg if cg and cg.kind == "child" else None)
        wake_w = run.wake[1]
        run.monitor = Monitor(run.procs, run_dir, spec, cgroup=cg, watchdog_budget=group.watchdog_budget,
                              wake=lambda: os.write(wake_w, b"x"))
        run.monitor.start()
        how = _wait_leader(run.proc, run.pidfd, run.wake[0], deadline, run.monitor)
        if how != "exited":
            run.stacks = _dump_stacks(run.procs, run_dir)
        run.wall = time.monotonic() - t0
        run.monitor.finish()
    except BaseException:
        run.abandon()
        raise
    finally:
        _close_fds(*run.wake, run.pidfd)  # only now: the monitor may write to the pipe until it stops
    return _collect(run, how, shm_before)


def _collect(run: _Run, how: str, shm_before: set) -> RunResult:
    """Kill what is left of the run, reap its main process, remove its files, and assemble the result."""
    cg, procs, proc = run.group.memory, run.procs, run.proc
    run.kernel_record = cg.record() if cg is not None else None
    run.left = procs.terminate()
    proc.wait()  # reaped only now: until here its number could not be anybody else's
    if cg is not None:
        run.kernel_record = cg.record() or run.kernel_record
    run.group.settle()
    records = _rd.RunDir(run.run_dir).read()  # every file the run's processes wrote, read once
    run.ticks = {p.pid: p.ticks for p in procs.known.values()}
    for rec in records.procs:
        run.ticks.setdefault(rec["pid"], rec.get("start_ticks"))
    run.processes_seen = len(procs.known)
    procs.close()
    if not run.spec.shm_size:
        owned = _ownership.owned_shm(shm_before, records.created_shm, run.ticks)
        run.removed, run.leftover = _ownership.remove_files(owned)
        run.created = sorted({*owned, *records.created_shm})
    left_tmp = _ownership.remove_temp_dirs(records.created_tmp)
    _ownership.ledger(run.created, run.leftover, run.ticks)
    run.leftover = list(run.leftover) + left_tmp
    kernel_lines = _cgroup.read_kernel_log(run.kmsg)
    return _evidence.assemble(run, run.monitor, records, kernel_lines, how)
