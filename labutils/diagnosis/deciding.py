"""What a record cannot prove about a cause, and the one command that decides it on the job's machine.

A log proves what it shows: a SIGKILL, not who sent it; a bus error, not whether /dev/shm was full. A run
proves more (exit statuses, the watchdog, the kernel's record), but not always the sender of a kill. Each
cause here has the question its evidence may leave open and the command that answers it where the job ran.
"""

from __future__ import annotations

SCRIPT = "python -m labutils diagnose SCRIPT"

#: cause -> (what the text alone cannot prove, the command that decides it on the job's machine)
OPEN: dict = {
    "oom_killed": ("who sent the SIGKILL: the kernel's OOM killer (memory), or a kill -9, a scheduler's "
                   "preemption, timeout -s KILL",
                   "dmesg -T | grep -iE 'killed process|out of memory'  (or the cgroup's memory.events: "
                   "grep oom_kill /sys/fs/cgroup/memory.events)"),
    "shm_exhausted": ("whether /dev/shm was really full: a bus error also comes from a memory-mapped file "
                      "cut short under its reader, and then the cause is native_crash", "df -h /dev/shm"),
    "fd_limit": ("whether the open-files limit was low or the code leaked descriptors", "ulimit -n"),
    "fork_refused": ("which limit refused the process (tasks, memory)",
                     "ulimit -u; cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids.current"),
    "native_crash": ("which native library crashed, and on which sample",
                     "PYTHONFAULTHANDLER=1 " + SCRIPT),
    "worker_exit": ("why the worker exited (its own exit call, a library, a signal the text does not show)",
                    SCRIPT),
    "hang": ("where the processes were stuck", "python -m labutils diagnose --stall 60 SCRIPT  (or py-spy dump "
                                               "--pid PID)"),
}


#: a worker's death named only by the status check's generic line (no exit code, no signal: forkserver and
#: spawn workers are not the main process's children, and the OOM killer's SIGKILL reads the same): memory first
GENERIC_DEATH = ("how the worker ended: the generic message carries no exit status; most often it is a SIGKILL "
                 "by the kernel's OOM killer (oom_killed), else the worker's own exit (worker_exit) or another "
                 "signal", OPEN["oom_killed"][1])


def open_question(cause: str, confidence: str) -> tuple:
    """``(what cannot be proved, deciding command)`` for a cause not decided with high confidence, else
    ``("", None)``; the command is the re-run under the lab where no sharper one exists."""
    if confidence == "high":
        return "", None
    what, command = OPEN.get(cause, ("the cause: nothing in the record decides it", SCRIPT))
    return what, command
