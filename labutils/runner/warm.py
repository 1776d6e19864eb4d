"""The runner's side of the warm launcher (``zygote.py``): when a run may start from the template, and
a Popen-like handle on a run started there.

One template per runner process (a notebook kernel, a pytest worker), started by the first run that can use
it and kept for the next ones; it ends with this process (end of file on its socket) or at
:func:`shutdown`. A run starts cold (``python bootstrap.py``) where starting from the template would not be
the same thing; :func:`refusal` says why. Two of the reasons are measured: a warm child shares torch's pages
with the template, so its USS and its cgroup charge are some 200 MB less than a cold one's (so no memory
budget and no memory figures warm), and it lacks the idle OpenBLAS thread a fresh process has, which a
process limit counts.

Every request to the template has a time limit, and a request that fails in any way (a timeout, an
interrupt between the question and the answer) discards the template: an answer left in the socket would
be read as the answer to the next question. The template is replaced before the next warm run when
anything a fresh process would start with changes (the environment, :func:`process_state`; a ``%pip
install`` in the kernel changes the packages the template imported).

The template starts in the background (it imports torch: 2-3 s here, far more on a busy machine or a
slow disk). A run waits for it at most its own ``timeout`` (and :data:`START_TIMEOUT` in all), else starts
cold while the template goes on starting; the run's timeout and ``wall_time`` count from its own start.
"""

from __future__ import annotations

import ast
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

from . import capabilities
from .cgroupfs import creator_tag
from .rundir import TMP_VARS
from .zygote import send

ZYGOTE = str(Path(__file__).with_name("zygote.py"))
#: variables read by the lab at run time, never by an import: a change in them does not need a new template
RUNTIME_ENV = frozenset({"LABUTILS_RUN_DIR", "LABUTILS_START_METHOD", "LABUTILS_MEMORY_ENFORCEMENT",
                         "LABUTILS_LAUNCHER", "LABUTILS_SHM_LEDGER", "PYTEST_CURRENT_TEST", "LABUTILS_RUNNER"})
_SUPPORTED = sys.platform.startswith("linux") and hasattr(os, "fork") and hasattr(socket, "send_fds")
#: seconds the template may take to start (it imports torch) and to answer a request
START_TIMEOUT = 120.0
ASK_TIMEOUT = 30.0


def supported() -> bool:
    """Linux with fork, fd passing and pidfds that work here (probed, not assumed)."""
    return _SUPPORTED and capabilities.has_pidfd()


_lock = threading.Lock()
_template: Optional["_Template"] = None
#: ``RUNNER_PID.RUNNER_START_TICKS`` in the template's environment, so in every process forked from it:
#: what ``ownership`` knows a warm run's forked processes by (a warm run's ``os.environ`` does not have it)
TEMPLATE_ENV = "LABUTILS_TEMPLATE"
#: the same mark in every run's environment, so in every process a run executes (spawn workers, a fork
#: server, a resource tracker, subprocesses)
RUNNER_ENV = "LABUTILS_RUNNER"


#: ``PID.START_TICKS`` of this process: the runner's identity, as it is written into its runs
runner_mark = creator_tag


def refusal(setting: str, *, env: Optional[dict], prefix: list, budget, detail: bool, python: str,
            process_limit: bool = False, source: Optional[str] = None) -> Optional[str]:
    """Why this run must start cold, or None when the template may start it."""
    if setting == "cold":
        return "the cold launcher was asked for"
    if not _SUPPORTED:
        return "the warm launcher needs Linux with fork and fd passing"
    cap = capabilities.pidfd()
    if not cap.available:
        return f"the warm launcher needs pidfds, and here {cap.result}"
    if env and any(not _runtime_key(k) for k in env):
        return "env= sets variables that must exist before torch is imported"
    if budget is not None:
        return "a memory budget: every page of the run must be charged to the run"
    if detail:
        return "memory figures (memory_detail or on_sample): the run's USS must include its own copy of torch's pages"
    if process_limit:
        return "a process limit: the tasks the kernel counts must be those of a fresh process"
    if prefix:
        return "a wrapper command (private /dev/shm or a systemd scope) starts the run"
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return "another interpreter was asked for"
    if source and sets_env_before_import(source):
        return ("the code sets an environment variable before it imports torch or numpy, which read theirs "
                "as they load")
    if source and starts_session(source):
        return ("the code starts a session of its own (os.setsid): a process it forks there is known as the "
                "run's only by the environment it started with, which a warm child does not have")
    return None


def starts_session(source: str) -> bool:
    """Does ``source`` name ``setsid`` (``os.setsid()``, ``preexec_fn=os.setsid``)? A process forked from a
    warm child keeps the template's startup environment in ``/proc/PID/environ`` (an assignment to
    ``os.environ`` changes only what later ``exec`` calls pass on); once it has left the run's session too,
    nothing proves it is the run's, and it would outlive the run."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return any((isinstance(node, ast.Attribute) and node.attr == "setsid")
               or (isinstance(node, ast.Name) and node.id == "setsid") for node in ast.walk(tree))


_HEAVY = ("torch", "numpy")
_ENV_CALLS = ("setdefault", "update", "putenv", "__setitem__")


def sets_env_before_import(source: str) -> bool:
    """Does ``source`` write to the environment before its first import of torch or numpy (or with no such
    import in sight: torch may come in through another module)? Native libraries read ``OMP_NUM_THREADS``
    and the like as they load, and in the template they loaded long ago."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    writes, imports = [], []
    for node in ast.walk(tree):
        where = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in _HEAVY for a in node.names):
            imports.append(where)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _HEAVY:
            imports.append(where)
        elif _is_env_write(node):
            writes.append(where)
    if not writes:
        return False
    return not imports or min(writes) < min(imports)


def _is_environ(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (isinstance(node, ast.Name)
                                                                            and node.id == "environ")


def _is_env_write(node) -> bool:
    if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        f = node.func
        if f.attr in _ENV_CALLS and _is_environ(f.value):
            return True
        return f.attr == "putenv" and isinstance(f.value, ast.Name) and f.value.id == "os"
    return False


def _runtime_key(name: str) -> bool:
    """Read only at run time: the lab's own variables, and the scenario knobs (``LAB_NUM_WORKERS``, ...) that
    the lab's scripts read; no import reads them, so a warm run may receive them."""
    return name in RUNTIME_ENV or name.startswith("LAB_")


def _key(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if not _runtime_key(k)))


def _rlimits() -> tuple:
    try:
        import resource
    except ImportError:  # pragma: no cover
        return ()
    return tuple((name, resource.getrlimit(getattr(resource, name)))
                 for name in sorted(dir(resource)) if name.startswith("RLIMIT_"))


def _umask() -> Optional[str]:
    try:  # /proc (Linux 4.7+) reads it without changing it; os.umask would set it, racing other threads
        with open("/proc/self/status", encoding="ascii") as fh:
            return next((line.split()[1] for line in fh if line.startswith("Umask:")), None)
    except OSError:
        return None


def package_dirs() -> list:
    """What a ``pip install`` changes: the site-packages directories on ``sys.path`` (an install adds or
    renames a ``*.dist-info`` there) and the ``__init__.py`` of the packages the template imports; and the
    bootstrap, which the template compiles once for all its runs."""
    import importlib.util

    found = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    for name in _HEAVY:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            found.append(spec.origin)
    return [*found, os.path.join(os.path.dirname(ZYGOTE), "bootstrap.py")]


def _mtimes(paths: list) -> tuple:
    stamps = []
    for path in paths:
        try:
            stamps.append((path, os.stat(path).st_mtime_ns))
        except OSError:
            stamps.append((path, None))
    return tuple(stamps)


_packages: Optional[list] = None


def process_state() -> tuple:
    """What a fresh process would inherit or import differently from the template, apart from the environment."""
    global _packages
    if _packages is None:
        _packages = package_dirs()
    affinity = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None
    return _rlimits(), affinity, _umask(), _mtimes(_packages)


class _Template:
    def __init__(self, env: dict):
        self.env = dict(env)
        self.key = _key(env)
        self.state = process_state()
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, ZYGOTE, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env={**self.env, TEMPLATE_ENV: runner_mark()},
                                     start_new_session=True)
        theirs.close()
        self.sock = ours
        self.buf = bytearray()
        self.lock = threading.Lock()
        self.poisoned: Optional[str] = None
        self.users = 0  # runs started from it (or about to be) and not yet reaped; see _get
        self.started = time.monotonic()
        self.ready = False  # the answer to the first ping (sent now) comes once torch is imported there
        try:
            with self.lock:
                self.sock.sendall(b'{"op": "ping"}\n')
        except BaseException:
            self.close()
            raise

    def matches(self, env: dict) -> bool:
        return (self.poisoned is None and self.proc.poll() is None and _key(env) == self.key
                and process_state() == self.state)

    def wait_ready(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the template to have started. False: not yet (it goes on
        starting; nothing is lost). Past :data:`START_TIMEOUT` from its start it is discarded (OSError)."""
        with self.lock:
            if self.ready:
                return True
            self._check()
            left = START_TIMEOUT - (time.monotonic() - self.started)
            try:
                line = self._read(min(timeout, left)) if left > 0 else None
            except socket.timeout:
                line = None
            except BaseException as exc:
                self._poison("start", exc)
                raise
            if line is not None:
                self.ready = True
                return True
            if time.monotonic() - self.started < START_TIMEOUT:
                return False
            exc = OSError(f"the warm template did not start within {START_TIMEOUT:.0f} s")
            self._poison("start", exc)
            raise exc

    def ask(self, request: dict, fds: tuple = (), timeout: float = ASK_TIMEOUT) -> tuple:
        """Send one request and read its answer within ``timeout`` seconds. Any failure on the way (a
        timeout, an interrupt, the template gone) poisons the template: it is closed, never asked again."""
        if not self.ready and not self.wait_ready(timeout):
            exc = OSError(f"the warm template had not started within {timeout:.0f} s")
            with self.lock:
                self._poison(str(request.get("op")), exc)
            raise exc
        with self.lock:
            self._check()
            got: list = []
            try:
                self.sock.settimeout(max(0.001, timeout))
                send(self.sock, request, fds)
                return json.loads(self._read(timeout, got)), got
            except BaseException as exc:
                for fd in got:
                    os.close(fd)
                self._poison(str(request.get("op")), exc)
                if isinstance(exc, socket.timeout):
                    raise OSError(f"the warm template did not answer {request.get('op')!r} within "
                                  f"{timeout:.0f} s") from None
                raise

    def _check(self) -> None:
        if self.poisoned is not None:
            raise OSError(f"the warm template was discarded ({self.poisoned})")

    def _read(self, timeout: float, got: Optional[list] = None) -> bytes:
        """One answer line (raises socket.timeout; a partial line stays in the buffer for the next read)."""
        self.sock.settimeout(max(0.001, timeout))
        while b"\n" not in self.buf:
            chunk, anc, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, 2)
            if got is not None:
                got.extend(anc)
            else:
                for fd in anc:
                    os.close(fd)
            if not chunk:
                raise OSError("the warm template exited")
            self.buf.extend(chunk)
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf[:] = rest
        return line

    def _poison(self, op: str, exc: BaseException) -> None:
        self.poisoned = f"{op}: {exc!r}"
        self.close(grace=0)

    def close(self, grace: float = 5.0) -> None:
        """End the template (it exits at end of file on its socket; SIGKILL after ``grace`` seconds); its
        children (a run it started) die with it (PDEATHSIG)."""
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def template_pid() -> Optional[int]:
    t = _template
    return t.proc.pid if t is not None and t.proc.poll() is None else None


_retired: list = []  # templates replaced while runs of theirs were in flight: closed when the last one ends


def _get(env: dict) -> "_Template":
    """The template for ``env``, with one more user (a run about to start; :func:`_release` when it ends).

    A template that no longer matches is replaced, but closed only when idle: the zygote exits when its
    socket closes and its children (runs in flight of another thread, e.g. the lab's) get PDEATHSIG."""
    global _template
    with _lock:
        if _template is not None and not _template.matches(env):
            _retire(_template)
            _template = None
        if _template is None:
            _template = _Template(env)
        _template.users += 1
        return _template


def _retire(template: "_Template") -> None:
    if template.users <= 0:
        template.close()
    elif template not in _retired:
        _retired.append(template)


def _release(template: "_Template") -> None:
    with _lock:
        template.users -= 1
        if template.users <= 0 and template in _retired:
            _retired.remove(template)
            template.close()


def shutdown() -> None:
    """End the template (a later warm run starts a new one), and any replaced one still serving a run."""
    global _template
    with _lock:
        for template in [*_retired, *([_template] if _template is not None else [])]:
            template.close()
        _retired.clear()
        _template = None


atexit.register(shutdown)


class WarmProcess:
    """What the runner needs of a ``subprocess.Popen`` for a run started by the template."""

    def __init__(self, template: _Template, pid: int, pidfd: int):
        self.template, self.pid, self.pidfd, self.returncode = template, pid, pidfd, None
        self._released = False

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
        if not self._released:
            self._released = True
            _release(self.template)
        return self.returncode


def template_env(env: dict) -> dict:
    """The environment a template for a run's ``env`` starts with: the run's, less what names the run (its
    run directory, and its own temporary folder, which goes with it: the template keeps this process's)."""
    base = {k: v for k, v in env.items() if k != "LABUTILS_RUN_DIR" and k not in TMP_VARS}
    base.update({k: os.environ[k] for k in TMP_VARS if k in os.environ})
    return base


class NotReady(OSError):
    """The template is still starting; it goes on starting for the next run."""


def spawn(env: dict, run_dir: str, cwd: Optional[str], stdout, stderr, wait: Optional[float] = None) -> WarmProcess:
    """Start ``bootstrap.py RUN_DIR`` as a child of the template. A template still starting is waited for
    at most ``wait`` seconds (None: :data:`START_TIMEOUT`), then :class:`NotReady`; OSError if the template
    fails or does not answer within :data:`ASK_TIMEOUT`."""
    template = _get(template_env(env))
    try:
        limit = START_TIMEOUT if wait is None else min(wait, START_TIMEOUT)
        t0 = time.monotonic()
        if not template.wait_ready(limit):
            raise NotReady(f"the warm template was still starting (importing torch) after "
                           f"{time.monotonic() - t0:.1f} s")
        reply, fds = template.ask({"op": "spawn", "run_dir": run_dir, "cwd": os.path.abspath(cwd or os.getcwd()),
                                   "env": env}, (stdout.fileno(), stderr.fileno()))
    except BaseException:
        _release(template)
        raise
    if "pid" not in reply or not fds:
        for fd in fds:
            os.close(fd)
        _release(template)
        raise OSError(f"the warm template could not start the run: {reply}")
    return WarmProcess(template, int(reply["pid"]), fds[0])
