"""The arguments of one isolated run, checked once: :class:`RunSpec`, built by :func:`RunSpec.build` from
``run_isolated``'s keywords. Every bad value is refused here, before any resource (a directory, an fd, a
cgroup, a process) is taken, with one line that names the argument and what is allowed."""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Optional, Union

from .sizes import format_size, parse_size

START_METHODS = ("fork", "spawn", "forkserver")
MIN_MEMORY_BUDGET = 64 * 2**20
MEMORY_ENFORCEMENTS = ("auto", "kernel", "watchdog")
MEMORY_ENFORCEMENT_ENV = "LABUTILS_MEMORY_ENFORCEMENT"


class StopRun(Exception):
    """Raise it from ``on_sample`` or ``on_event`` to end the run now, when what it was run to show has
    happened (say, every DataLoader worker died and the script would only wait after that). The runner kills
    every process of the run as at its timeout: the outcome is ``timed_out``, and ``result.reason`` starts
    with "stopped on request" and your message."""


class IsolationError(ValueError):
    """A run_isolated argument the runner cannot honour; the message says what to do.

    For a bad value of one argument, ``argument`` (the Python name, e.g. ``"shm_size"``), ``value`` and
    ``problem`` are set too, so that a front end can name its own option: ``exc.for_option("--shm-size")``.
    """

    def __init__(self, message: str, *, argument: Optional[str] = None, value: Any = None,
                 problem: Optional[str] = None):
        super().__init__(message)
        self.argument, self.value, self.problem = argument, value, problem

    def for_option(self, option: str) -> str:
        """The message with the front end's name for the argument: ``--shm-size 0: is below 64 KiB...``."""
        if self.argument is None or self.problem is None:
            return str(self)
        value = str(self.value)
        return f"{option} {value if value and not any(c.isspace() for c in value) else repr(value)}: {self.problem}"


Target = Union[str, os.PathLike]


def _resolve_func(func: Union[Callable, str]) -> tuple:
    if isinstance(func, str):
        module, sep, qualname = func.partition(":")
        if not sep or not module or not qualname:
            raise IsolationError(f"func={func!r}: give a callable or a 'module:function' string")
        return module, qualname, None
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise IsolationError(f"func={func!r} is not a module-level function; define it at the top of a "
                             "module (e.g. with %%writefile) so a fresh process can import it")
    if module == "__main__":
        raise IsolationError(f"func={qualname} is defined in __main__ (this notebook), which a fresh process "
                             "cannot import; pass the code as a cell (%%isolate) or put it in a module file")
    path = None
    try:
        path = inspect.getsourcefile(func)
    except TypeError:
        pass
    return module, qualname, path


def _bad(argument: str, value: Any, problem: str) -> IsolationError:
    return IsolationError(f"{argument}={value!r}: {problem}", argument=argument, value=value, problem=problem)


def _size_arg(argument: str, value: Any) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        problem = str(exc)
        prefix = f"invalid size {value!r}: "
        raise _bad(argument, value, problem[len(prefix):] if problem.startswith(prefix) else problem) from None


_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


def _cell_bytes(code: str) -> bytes:
    """The cell's text as the bytes of a module file: in the encoding its coding cookie declares, if any."""
    for line in code.splitlines()[:2]:
        m = _COOKIE.match(line.encode("utf-8", "replace"))
        if m:
            encoding = m.group(1).decode("ascii")
            try:
                return code.encode(encoding)
            except LookupError:
                raise _bad("code", f"coding: {encoding}", "unknown encoding in the coding cookie") from None
            except UnicodeEncodeError as exc:
                raise _bad("code", f"coding: {encoding}", f"the cell has characters {encoding} cannot "
                           f"hold ({exc.reason}); remove the cookie or use utf-8") from None
        if line.strip() and not line.lstrip().startswith("#"):
            break
    return code.encode("utf-8")


def _enforcement(value: Optional[str]) -> str:
    chosen = value if value is not None else (os.environ.get(MEMORY_ENFORCEMENT_ENV, "").strip() or "auto")
    if chosen not in MEMORY_ENFORCEMENTS:
        argument = "memory_enforcement" if value is not None else MEMORY_ENFORCEMENT_ENV
        raise _bad(argument, chosen, f"use one of {', '.join(MEMORY_ENFORCEMENTS)}")
    return chosen



def _hard_nofile() -> Optional[int]:
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return None if hard == resource.RLIM_INFINITY else hard



def _seconds(argument: str, value: Any, low: float = 0.0, high: Optional[float] = None, none_ok: bool = True):
    """A finite number of seconds above ``low`` (and at most ``high``); None where ``none_ok``."""
    if value is None and none_ok:
        return None
    allowed = "a finite number of seconds" + (f" above {low:g}" if low == 0 else f" of at least {low:g}")
    allowed += f" and at most {high:g}" if high is not None else ""
    allowed += " (or None)" if none_ok else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(argument, value, f"give {allowed}")
    if not math.isfinite(value) or (value <= low if low == 0 else value < low) or (high is not None and value > high):
        raise _bad(argument, value, f"give {allowed}")
    return float(value) if isinstance(value, float) else value


def _path_arg(argument: str, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)) or isinstance(value, bytes):
        raise _bad(argument, value, "give a path (a str or a pathlib.Path)")
    text = os.fspath(value)
    if not text or "\0" in text:
        raise _bad(argument, value, "give a non-empty path without NUL characters")
    return text


def _cwd_arg(value: Any) -> Optional[str]:
    if value is None:
        return None
    path = _path_arg("cwd", value)
    if not os.path.isdir(path):
        raise _bad("cwd", path, "is not an existing directory; give the folder the run should start in")
    return os.path.abspath(path)


def _env_arg(value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _bad("env", value, "give a dict of environment variables, {'NAME': 'value'}")
    out = {}
    for key, val in value.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise _bad("env", {key: val}, "a variable's name must be a non-empty str without '=' or NUL")
        if isinstance(val, bool) or not isinstance(val, (str, int, float)):
            raise _bad("env", {key: val}, "a variable's value must be a str (or a number)")
        text = str(val)
        if "\0" in text:
            raise _bad("env", {key: val}, "a variable's value cannot hold a NUL character")
        out[key] = text
    method = out.get("LABUTILS_START_METHOD", "").strip()
    if method and method not in START_METHODS:
        raise _bad("env", {"LABUTILS_START_METHOD": method}, f"use one of {', '.join(START_METHODS)}")
    return out


def _python_arg(value: Any) -> str:
    if value is None:
        return sys.executable
    path = _path_arg("python", value)
    found = path if os.sep in path else shutil.which(path)
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise _bad("python", path, "is not an executable Python interpreter; give its path (e.g. sys.executable)")
    return found


def _argv_arg(value: Any) -> list:
    if isinstance(value, (str, bytes)):
        raise _bad("argv", value, "give a list of strings, e.g. ['--epochs', '3'] (a str would be split into "
                   "characters)")
    try:
        items = list(value)
    except TypeError:
        raise _bad("argv", value, "give a list of strings, e.g. ['--epochs', '3']") from None
    out = []
    for item in items:
        if isinstance(item, os.PathLike):
            item = os.fspath(item)
        if not isinstance(item, str) or "\0" in item:
            raise _bad("argv", value, "every item must be a str without NUL characters")
        out.append(item)
    return out


def _int_arg(argument: str, value: Any, low: int, why: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _bad(argument, value, f"give an integer of at least {low} ({why})")
    return value


def _flag(argument: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _bad(argument, value, "give True or False")
    return value


#: run_isolated's keywords and their defaults (besides ``code``)
KEYWORDS = dict(file=None, func=None, args=(), kwargs=None, argv=(), start_method=None, timeout=60.0,
                memory_budget=None, shm_size=None, nofile=None, env=None, notebook_main=False, max_processes=None,
                cwd=None, sample_interval=0.05, memory_detail=False, python=None, memory_enforcement=None,
                stall=None, on_sample=None, on_event=None, launcher=None)


@dataclass
class RunSpec:
    """One isolated run, validated: what to run, its limits and its listeners."""

    mode: str  # "code", "file" or "func"
    code: Optional[str] = None
    path: Optional[str] = None  # the script (mode "file")
    func: tuple = ()  # (module, qualname, source file) for mode "func"
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    argv: list = field(default_factory=list)
    start_method: Optional[str] = None
    lab_default: Optional[str] = None
    timeout: Optional[float] = 60.0
    budget: Optional[int] = None
    shm: Optional[int] = None
    nofile: Optional[int] = None
    env: dict = field(default_factory=dict)
    notebook_main: bool = False
    max_processes: Optional[int] = None
    cwd: Optional[str] = None
    sample_interval: float = 0.05
    memory_detail: bool = False
    python: str = sys.executable
    enforcement: str = "auto"
    stall: Optional[float] = None
    on_sample: Optional[Callable] = None
    on_event: Optional[Callable] = None
    launcher: str = "auto"

    @classmethod
    def build(cls, code=None, **keywords) -> "RunSpec":
        """Check every keyword of ``run_isolated`` (same names, same defaults, same meaning: see
        :data:`KEYWORDS`); raise IsolationError naming the first bad one."""
        unknown = sorted(set(keywords) - set(KEYWORDS))
        if unknown:
            raise TypeError(f"run_isolated() got unexpected keyword arguments: {', '.join(unknown)}")
        a = SimpleNamespace(**{**KEYWORDS, **keywords})
        if sum(x is not None for x in (code, a.file, a.func)) != 1:
            raise IsolationError("give exactly one of code=, file= or func=")
        if a.start_method is not None and a.start_method not in START_METHODS:
            raise _bad("start_method", a.start_method, f"use one of {', '.join(START_METHODS)}")
        if a.start_method is not None and a.start_method != "spawn" and sys.platform == "win32":
            raise IsolationError("only 'spawn' exists on Windows; run the lab under WSL for fork/forkserver")
        spec = cls(mode="code" if code is not None else "file" if a.file is not None else "func",
                   argv=_argv_arg(a.argv), start_method=a.start_method, cwd=_cwd_arg(a.cwd),
                   timeout=_seconds("timeout", a.timeout), stall=_seconds("stall", a.stall),
                   sample_interval=_seconds("sample_interval", a.sample_interval, 0.01, 60.0, none_ok=False),
                   env=_env_arg(a.env), python=_python_arg(a.python), enforcement=_enforcement(a.memory_enforcement),
                   notebook_main=_flag("notebook_main", a.notebook_main),
                   memory_detail=_flag("memory_detail", a.memory_detail))
        spec._limits(a.memory_budget, a.shm_size, a.nofile, a.max_processes)
        spec._target(code, a.file, a.func, a.args, a.kwargs)
        for name in ("on_sample", "on_event"):
            fn = getattr(a, name)
            if fn is not None and not callable(fn):
                raise _bad(name, fn, "give a function that takes one dict")
        spec.on_sample, spec.on_event = a.on_sample, a.on_event
        from . import startmethod as _startmethod
        from . import warm as _warm

        try:
            spec.lab_default = _startmethod.requested()
            spec.launcher = _warm.launcher_setting(a.launcher)
        except ValueError as exc:
            raise IsolationError(str(exc)) from None
        return spec

    def _limits(self, memory_budget, shm_size, nofile, max_processes) -> None:
        from .pids import MIN_MAX_PROCESSES

        budget = _size_arg("memory_budget", memory_budget) if memory_budget is not None else None
        if budget is not None and budget < MIN_MEMORY_BUDGET:
            raise _bad("memory_budget", memory_budget,
                       f"is {format_size(budget)}, below the lab's floor of {format_size(MIN_MEMORY_BUDGET)}: a "
                       "Python process with torch needs more than that before your code runs, so the run would "
                       "be killed at start-up; give e.g. '600M'")
        shm = _size_arg("shm_size", shm_size) if shm_size is not None else None
        if shm is not None and shm < 64 * 1024:
            raise _bad("shm_size", shm_size, "is below 64 KiB; give e.g. '8M'")
        self.nofile = _int_arg("nofile", nofile, 16, "Python needs a few fds")
        hard = _hard_nofile()
        if self.nofile is not None and hard is not None and self.nofile > hard:
            raise _bad("nofile", nofile, f"is above this machine's hard limit of {hard} open files "
                       f"(`ulimit -Hn`); give at most {hard}")
        self.max_processes = _int_arg("max_processes", max_processes, MIN_MAX_PROCESSES,
                                      "the run's main process and its threads")
        self.budget, self.shm = budget, shm

    def _target(self, code, file, func, args, kwargs) -> None:
        if self.notebook_main and func is not None:
            raise IsolationError("notebook_main=True needs code= or file=, not func=")
        if code is not None:
            if not isinstance(code, str):
                raise _bad("code", code, "give the cell's text as a str")
            _cell_bytes(code)  # a bad coding cookie is refused now, not after the run dir exists
            self.code = code
        elif file is not None:
            text = _path_arg("file", file)
            path = os.path.abspath(os.path.join(self.cwd or os.getcwd(), text))
            if os.path.isdir(path):
                raise _bad("file", text, "is a directory; give the script's .py file")
            if not os.path.isfile(path):
                raise _bad("file", text, "does not exist" + (f" in cwd={self.cwd}" if self.cwd and not
                                                             os.path.isabs(text) else "") + "; check the path")
            self.path = path
        else:
            self.func = _resolve_func(func)
            self.args, self.kwargs = list(args), dict(kwargs or {})
            try:
                json.dumps([self.args, self.kwargs])
            except (TypeError, ValueError) as exc:
                raise IsolationError(f"args/kwargs must be JSON values (numbers, strings, lists): {exc}") from None

    def options(self) -> dict:
        """The run's settings as ``result.options`` reports them."""
        out = {"start_method": self.start_method, "lab_default_start_method": self.lab_default,
               "timeout": self.timeout, "memory_budget": self.budget, "shm_size": self.shm, "nofile": self.nofile,
               "notebook_main": self.notebook_main, "env": dict(self.env), "memory_enforcement": self.enforcement,
               "stall": self.stall, "launcher": self.launcher}
        if self.max_processes is not None:
            out["max_processes"] = self.max_processes
        return out
