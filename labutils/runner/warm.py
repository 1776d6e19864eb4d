"""The runner's side of the warm launcher (``zygote.py``): when a run may start from the template, and
a Popen-like handle on a run started there.

One template per runner process (a notebook kernel, a pytest worker, ``python -m labutils tour``), started
by the first run that can use it and kept for the next ones; it ends when this process ends (end of file
on its socket) or when :func:`shutdown` is called. A run takes the cold path (``python bootstrap.py``,
a fresh interpreter) when starting from the template would not be the same thing:

* ``LABUTILS_LAUNCHER=cold`` (or ``launcher="cold"``) asks for it;
* the run sets environment variables (``env=``) other than the lab's knobs (``LAB_*``): they must exist
  before torch is imported;
* a memory budget or memory figures (``memory_detail``): the run's pages must all be its own from the
  first one (a warm child shares torch's pages with the template, so its USS and its cgroup charge differ);
* a process limit (``max_processes``): the kernel counts threads too, and a warm child lacks the idle
  OpenBLAS thread a fresh process has;
* a private /dev/shm or a systemd scope: a wrapper command starts the run;
* another interpreter (``python=``), or a platform without fork and pidfds.

The template is started with this process's environment; if that changes (or the open-files limit
does), the template is replaced before the next warm run.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

ZYGOTE = str(Path(__file__).with_name("zygote.py"))
LAUNCHER_ENV = "LABUTILS_LAUNCHER"
LAUNCHERS = ("auto", "warm", "cold")
#: variables read by the lab at run time, never by an import: a change in them does not need a new template
RUNTIME_ENV = frozenset({"LABUTILS_RUN_DIR", "LABUTILS_START_METHOD", "LABUTILS_MEMORY_ENFORCEMENT",
                         "LABUTILS_LAUNCHER", "LABUTILS_SHM_LEDGER", "PYTEST_CURRENT_TEST"})
_SUPPORTED = (sys.platform.startswith("linux") and hasattr(os, "fork") and hasattr(os, "pidfd_open")
              and hasattr(socket, "send_fds"))

_lock = threading.Lock()
_template: Optional["_Template"] = None
#: (session id, leader start ticks, end time) of finished warm runs: what find_strays looks for
finished_sessions: list = []


def launcher_setting(value: Optional[str]) -> str:
    chosen = value if value is not None else os.environ.get(LAUNCHER_ENV, "auto")
    if chosen not in LAUNCHERS:
        raise ValueError(f"launcher={chosen!r}: use one of {', '.join(LAUNCHERS)} (or unset {LAUNCHER_ENV})")
    return chosen


def refusal(setting: str, *, env: Optional[dict], prefix: list, budget, detail: bool, python: str,
            process_limit: bool = False) -> Optional[str]:
    """Why this run must start cold, or None when the template may start it."""
    if setting == "cold":
        return "the cold launcher was asked for"
    if not _SUPPORTED:
        return "the warm launcher needs Linux with fork and pidfds"
    if env and any(not _runtime_key(k) for k in env):
        return "env= sets variables that must exist before torch is imported"
    if budget is not None:
        return "a memory budget: every page of the run must be charged to the run"
    if detail:
        return "memory figures: the run's USS must include its own copy of torch's pages"
    if process_limit:
        return "a process limit: the tasks the kernel counts must be those of a fresh process"
    if prefix:
        return "a wrapper command (private /dev/shm or a systemd scope) starts the run"
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return "another interpreter was asked for"
    return None


def _runtime_key(name: str) -> bool:
    """Read only at run time: the lab's own variables, and the scenario knobs (``LAB_NUM_WORKERS``, ...) that
    the lab's scripts read; no import reads them, so a warm run may receive them."""
    return name in RUNTIME_ENV or name.startswith("LAB_")


def _key(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if not _runtime_key(k)))


def _nofile() -> Optional[tuple]:
    try:
        import resource

        return resource.getrlimit(resource.RLIMIT_NOFILE)
    except ImportError:  # pragma: no cover
        return None


class _Template:
    def __init__(self, env: dict):
        self.env = dict(env)
        self.key = _key(env)
        self.nofile = _nofile()
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, ZYGOTE, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=self.env, start_new_session=True)
        theirs.close()
        self.sock = ours
        self.buf = bytearray()
        self.lock = threading.Lock()
        self.ask({"op": "ping"})  # returns once torch is imported there

    def matches(self, env: dict) -> bool:
        return self.proc.poll() is None and _key(env) == self.key and _nofile() == self.nofile

    def ask(self, request: dict, fds: tuple = ()) -> tuple:
        with self.lock:
            data = json.dumps(request).encode("utf-8") + b"\n"
            if fds:
                socket.send_fds(self.sock, [data], list(fds))
            else:
                self.sock.sendall(data)
            got = []
            while b"\n" not in self.buf:
                chunk, anc, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, 2)
                if not chunk:
                    raise OSError("the warm template exited")
                self.buf.extend(chunk)
                got.extend(anc)
            line, _, rest = bytes(self.buf).partition(b"\n")
            self.buf[:] = rest
            return json.loads(line), got

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def template_pid() -> Optional[int]:
    t = _template
    return t.proc.pid if t is not None and t.proc.poll() is None else None


def _get(env: dict) -> "_Template":
    global _template
    with _lock:
        if _template is not None and not _template.matches(env):
            _template.close()
            _template = None
        if _template is None:
            _template = _Template(env)
        return _template


def shutdown() -> None:
    """End the template (a later warm run starts a new one)."""
    global _template
    with _lock:
        if _template is not None:
            _template.close()
            _template = None


atexit.register(shutdown)


class WarmProcess:
    """What the runner needs of a ``subprocess.Popen`` for a run started by the template."""

    def __init__(self, template: _Template, pid: int, pidfd: int):
        self.template, self.pid, self.pidfd, self.returncode = template, pid, pidfd, None
        self.start_ticks = None

    def wait(self) -> Optional[int]:
        """Reap the run's main process (only once its group has been killed) and return its exit code."""
        if self.returncode is None:
            try:
                reply, _fds = self.template.ask({"op": "reap", "pid": self.pid})
                status = reply.get("status")
            except OSError:
                status = None
            if status is not None:
                self.returncode = os.waitstatus_to_exitcode(status)
            finished_sessions.append((self.pid, self.start_ticks, time.time()))
            del finished_sessions[:-1000]
        return self.returncode


def spawn(env: dict, run_dir: str, cwd: Optional[str], stdout, stderr) -> WarmProcess:
    """Start ``bootstrap.py RUN_DIR`` as a child of the template; raises OSError if the template fails."""
    template = _get({k: v for k, v in env.items() if k != "LABUTILS_RUN_DIR"})
    reply, fds = template.ask({"op": "spawn", "run_dir": run_dir, "cwd": os.path.abspath(cwd or os.getcwd()),
                               "env": env}, (stdout.fileno(), stderr.fileno()))
    if "pid" not in reply or not fds:
        for fd in fds:
            os.close(fd)
        raise OSError(f"the warm template could not start the run: {reply}")
    proc = WarmProcess(template, int(reply["pid"]), fds[0])
    from . import procs as _procs

    proc.start_ticks = _procs.start_ticks(proc.pid)
    return proc
