"""After a run: its result assembled from what the run wrote, what the monitor saw and what the kernel
recorded, with every file read to a cap (a run can print without end; the kernel must not read it all)."""

from __future__ import annotations

import os
import re
from typing import Optional

from . import rundir as _rd
from .result import ExceptionInfo, ProcessInfo, RunResult

#: at most this much of stdout and of stderr is read back: its first and last halves, and a line saying
#: how much was cut in between (``result.truncated``)
OUTPUT_CAP = 2 * 2**20


def workers(procs_log: list, monitor, exits: dict, killed_by_kernel: set, stopped: frozenset = frozenset()) -> list:
    """A :class:`ProcessInfo` for each process the run's main process started, its exit code from the
    first source that has it: the main process's final record, its reaping log, the monitor's events,
    else -9 where the kernel or the watchdog killed it and no parent was left to reap it. A process with
    none of these that the runner found still running at the run's end (``stopped``) is marked so: its
    ending is the lab's SIGKILL, not one of the run's own."""
    event_status = {e["pid"]: e for e in monitor.events}
    out = []
    for rec in procs_log:
        pid = rec["pid"]
        info = monitor.seen.get(pid, {})
        kill = next((k for k in monitor.kills if k["pid"] == pid), None)
        exitcode = exits.get(pid)
        if exitcode is None:
            exitcode = monitor.exit_codes.get(pid)
        if exitcode is None and pid in event_status:
            ev = event_status[pid]
            exitcode = -ev["signal"] if ev.get("signal") else ev.get("exitcode")
        if exitcode is None and (pid in killed_by_kernel or kill is not None):
            exitcode = -9
        out.append(ProcessInfo(
            pid=pid, name=rec.get("name", ""), role="dataloader_worker"
            if rec.get("target", "").endswith("_worker_loop") else "process",
            exitcode=exitcode, peak_rss=info.get("peak_rss"), peak_uss=info.get("peak_uss"),
            killed_by_watchdog=kill is not None, killed_by_kernel_oom=pid in killed_by_kernel,
            stopped_by_lab=exitcode is None and pid in stopped))
    return out


def outcome(how: str, rc: Optional[int], spec, monitor, stderr: str, cfg: dict) -> tuple:
    """``(outcome, reason)`` of the run from how the wait ended and the main process's exit code."""
    if how == "timeout":
        return "timed_out", f"no result within {spec.timeout:g} s; the runner killed every process of the run"
    if how == "asked":
        return "timed_out", (f"stopped on request: {monitor.stop_requested} (a listener raised StopRun); the "
                             "runner killed every process of the run")
    if how == "stalled":
        return "timed_out", (f"no batch for {monitor.stalled['idle_s']:g} s (stall={spec.stall:g}) while DataLoader "
                             f"workers were alive, after {monitor.stalled['batches']} batches; the runner killed "
                             "every process of the run")
    if how == "output" and monitor.overflow_of not in (None, "output"):
        return "failed", (f"the run's processes wrote more than {monitor.evidence_limit // 2**20} MiB of "
                          f"evidence records (the most to {monitor.overflow_of}: labutils.emit or DataLoader "
                          "records in a loop); the runner stopped it")
    if how == "output":
        return "failed", (f"the run wrote more than {monitor.output_limit // 2**20} MiB to stdout/stderr; the "
                          "runner stopped it (its output is shown cut, see result.truncated)")
    if how == "monitor":
        return "failed", ("the lab's memory watchdog could not watch the run any more (see "
                          "result.monitor_errors), so the runner stopped it rather than leave the budget unenforced")
    if rc == _rd.JOIN_FAILED and (cfg.get("cgroup_procs") or cfg.get("pids_procs")) and _rd.JOIN_FAILED_TEXT in stderr:
        return "unsupported", stderr.strip().splitlines()[-1]
    return ("ok" if rc == 0 else "failed"), None


def output(run_dir: str) -> tuple:
    """``(stdout, stderr, truncated)``, both read to :data:`OUTPUT_CAP`."""
    texts, truncated = [], {}
    for key, name in (("stdout", _rd.STDOUT), ("stderr", _rd.STDERR)):
        text, size, cut = _rd.read_capped(os.path.join(run_dir, name), OUTPUT_CAP)
        texts.append(text)
        if cut:
            truncated[key] = {"size": size, "kept": size - cut, "cut": cut, "cap": OUTPUT_CAP}
    return texts[0], texts[1], truncated


def assemble(run, monitor, records: _rd.RunRecords, kernel_lines: list, how: str) -> RunResult:
    """The :class:`RunResult` of a finished run (``run``: what ``isolate._collect`` gathered)."""
    d, proc, group = run.run_dir, run.proc, run.group
    exits = {p["pid"]: p.get("exitcode") for p in records.final.get("processes", []) if isinstance(p, dict)}
    rc = proc.returncode
    memory_limit = group.memory_limit
    killed_by_kernel: set = set()
    if memory_limit is not None and memory_limit["enforced_by"] == "kernel":
        memory_limit["kernel_record"] = _kernel_record(run.kernel_record, kernel_lines, group.memory, run.ticks,
                                                       monitor, exits, (rc, proc.pid, how))
        killed_by_kernel = set(memory_limit["kernel_record"]["killed_pids"])
    stdout, stderr, truncated = output(d)
    main_stack = run.stacks.get(proc.pid)
    if main_stack:
        stderr += (f"\n--- labutils: Python stack of the main process (pid {proc.pid}) before the runner "
                   f"killed the run ---\n{main_stack}")
    result_outcome, reason = outcome(how, rc, run.spec, monitor, stderr, run.cfg)
    return RunResult(
        outcome=result_outcome, returncode=rc, signal=-rc if rc is not None and rc < 0 else None,
        workers=workers(records.procs, monitor, exits, killed_by_kernel, frozenset(run.procs.stopped)),
        exceptions=[ExceptionInfo(**e) for e in records.exc], loader_events=records.loader_events,
        stdout=stdout, stderr=stderr, wall_time=run.wall, peak_rss=monitor.seen.get(proc.pid, {}).get("peak_rss"),
        watchdog_kills=list(monitor.kills), samples=monitor.samples, processes_seen=run.processes_seen,
        stray_processes=run.left, shm_removed=run.removed, reason=reason, options=run.options,
        value=records.value, values=records.emitted, memory_limit=memory_limit, stall=monitor.stalled,
        stacks=run.stacks, events=list(monitor.events), leftover_files=run.leftover, shm_created=run.created,
        launcher=run.launcher, truncated=truncated,
        monitor_errors=[*monitor.errors, *(f"a listener (on_sample/on_event) raised {e}" for e in
                                           monitor.callback_errors)], leftover_cgroups=list(group.leftover))


_KILLED_LINE = re.compile(r"Killed process (\d+) \(([^)]*)\)")
_PID_FIELD = re.compile(r"\bpid=(\d+),")


def host_pid_namespace() -> bool:
    """Is this process in the initial pid namespace, whose pid numbers the kernel log prints? ``NSpid`` in
    /proc/self/status has one number there and one per namespace level below it (comparing with /proc/1's
    namespace would not do: a container's pid 1 shares the container's). True when it cannot be told."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return len(line.split()) == 2
    except OSError:
        pass
    return True


def _kernel_record(record, lines, cgroup, ticks, monitor, exits, main: tuple) -> dict:
    """The kernel's counters for the run's group, its log lines about the run, and who it killed.
    ``main``: the main process's ``(returncode, pid, how the wait ended)``."""
    rc, main_pid, how = main
    out = dict(record or {})
    out["cgroup"] = cgroup.directory
    name = os.path.basename(cgroup.directory or "") or None
    ours = []
    killed = []
    # The kernel log prints pids of the initial pid namespace. In a container with its own pid namespace
    # (and a readable /dev/kmsg) a "Killed process N" of the host may carry the number of one of our
    # processes: there a kill is the run's only when the OOM record for pid N names the run's cgroup.
    by_number = host_pid_namespace()
    in_group = {int(m.group(1)) for line in lines if name and name in line for m in _PID_FIELD.finditer(line)}
    for line in lines:
        if name and name in line or by_number and any(f"pid={p}," in line for p in ticks):
            ours.append(line)
        m = _KILLED_LINE.search(line)
        if m and int(m.group(1)) in ticks and (by_number or int(m.group(1)) in in_group):
            if line not in ours:
                ours.append(line)
            killed.append(int(m.group(1)))
    out["dmesg"] = ours if lines else None
    how_known = "dmesg" if killed else None
    if not killed:
        # no readable kernel log: the processes that died by SIGKILL while oom_kill counted
        killed = list(monitor.kernel_oom_pids)
        how_known = "monitor" if killed else None
        if not killed and out.get("oom_kill"):
            sigkilled = [pid for pid, code in exits.items() if code == -9]
            if rc == -9 and how == "exited":
                sigkilled.append(main_pid)
            if len(sigkilled) == out["oom_kill"]:
                killed, how_known = sigkilled, "exit status"
    out["killed_pids"] = sorted(set(killed))
    out["main_killed"] = main_pid in out["killed_pids"]
    out["killed_pids_from"] = how_known
    return out

