"""The options of one isolated run, declared once in a table, and checked once.

:data:`OPTIONS` holds one :class:`Option` row per keyword of :func:`labutils.run_isolated`; its signature
and docstring, the fields of :class:`RunSpec` and the flags of :func:`add_run_options` are built from it:
a new run limit is one row here (plus what the runner does with it). :meth:`RunSpec.build` checks every
value before any resource is taken; a bad value is one line naming the argument and what is allowed, and
``exc.for_option()`` names the command line's flag instead. A front end::

    parser = argparse.ArgumentParser(prog="mytool")
    add_run_options(parser, ["timeout", "shm_size"], timeout=None)   # this tool's own default
    args = parser.parse_args(["--shm-size", "0"])
    try:
        result = run_isolated(file="train.py", **run_options(args))
    except IsolationError as exc:
        parser.error(exc.for_option())   # --shm-size 0: is below 64 KiB; give e.g. '8M'
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import re
import shutil
import sys
import textwrap
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterable, Mapping, Optional, Union

from . import startmethod as _startmethod
from .pids import MIN_MAX_PROCESSES
from .sizes import format_size, parse_size

START_METHODS = ("fork", "spawn", "forkserver")
MIN_MEMORY_BUDGET = 64 * 2**20
MEMORY_ENFORCEMENTS = ("auto", "kernel", "watchdog")
MEMORY_ENFORCEMENT_ENV = "LABUTILS_MEMORY_ENFORCEMENT"
LAUNCHERS = ("auto", "warm", "cold")
LAUNCHER_ENV = "LABUTILS_LAUNCHER"


class StopRun(Exception):
    """Raise it from ``on_sample`` or ``on_event`` to end the run now, when what it was run to show has
    happened (say, every DataLoader worker died and the script would only wait after that). The runner kills
    every process of the run as at its timeout: the outcome is ``timed_out``, and ``result.reason`` starts
    with "stopped on request" and your message."""


class IsolationError(ValueError):
    """A run_isolated argument the runner cannot honour; the message says what to do. For a bad value of
    one argument, ``argument`` (e.g. ``"shm_size"``), ``value`` and ``problem`` are set too."""

    def __init__(self, message: str, *, argument: Optional[str] = None, value: Any = None,
                 problem: Optional[str] = None):
        super().__init__(message)
        self.argument, self.value, self.problem = argument, value, problem

    def for_option(self, option: Optional[str] = None) -> str:
        """The message with a command line's name for the argument (default: its flag in :data:`OPTIONS`):
        ``--shm-size 0: is below 64 KiB...``."""
        row = _BY_NAME.get(self.argument)
        option = option or (row.flag if row is not None else None)
        if option is None or self.problem is None:
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


def _cwd_arg(argument: str, value: Any) -> Optional[str]:
    if value is None:
        return None
    path = _path_arg(argument, value)
    if not os.path.isdir(path):
        raise _bad(argument, path, "is not an existing directory; give the folder the run should start in")
    return os.path.abspath(path)


def _env_arg(argument: str, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _bad(argument, value, "give a dict of environment variables, {'NAME': 'value'}")
    out = {}
    for key, val in value.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise _bad(argument, {key: val}, "a variable's name must be a non-empty str without '=' or NUL")
        if isinstance(val, bool) or not isinstance(val, (str, int, float)):
            raise _bad(argument, {key: val}, "a variable's value must be a str (or a number)")
        text = str(val)
        if "\0" in text:
            raise _bad(argument, {key: val}, "a variable's value cannot hold a NUL character")
        out[key] = text
    method = out.get("LABUTILS_START_METHOD", "").strip()
    if method and method not in START_METHODS:
        raise _bad(argument, {"LABUTILS_START_METHOD": method}, f"use one of {', '.join(START_METHODS)}")
    return out


def _python_arg(argument: str, value: Any) -> str:
    if value is None:
        return sys.executable
    path = _path_arg(argument, value)
    found = path if os.sep in path else shutil.which(path)
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise _bad(argument, path, "is not an executable Python interpreter; give its path (e.g. sys.executable)")
    return found


def _argv_arg(argument: str, value: Any) -> list:
    if isinstance(value, (str, bytes)):
        raise _bad(argument, value, "give a list of strings, e.g. ['--epochs', '3'] (a str would be split into "
                   "characters)")
    try:
        items = list(value)
    except TypeError:
        raise _bad(argument, value, "give a list of strings, e.g. ['--epochs', '3']") from None
    out = []
    for item in items:
        if isinstance(item, os.PathLike):
            item = os.fspath(item)
        if not isinstance(item, str) or "\0" in item:
            raise _bad(argument, value, "every item must be a str without NUL characters")
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


def _given(argument: str, value: Any) -> Any:
    """What to run (``file``, ``func``, ``args``, ``kwargs``): checked together by :meth:`RunSpec._target`."""
    return value


def _choice(choices: tuple, env: Optional[str] = None) -> Callable[[str, Any], Optional[str]]:
    """A check: one of ``choices``; None means ``env``'s value where there is one, else ``choices[0]``."""

    def check(argument: str, value: Any) -> Optional[str]:
        if value is None and env is None:
            return None
        chosen = value if value is not None else (os.environ.get(env, "").strip() or choices[0])
        if chosen not in choices:
            raise _bad(argument if value is not None else env, chosen, f"use one of {', '.join(choices)}")
        return chosen

    return check


def _start_method(argument: str, value: Any) -> Optional[str]:
    method = _choice(START_METHODS)(argument, value)
    if method is not None and method != "spawn" and sys.platform == "win32":
        raise IsolationError("only 'spawn' exists on Windows; run the lab under WSL for fork/forkserver")
    return method


def _budget(argument: str, value: Any) -> Optional[int]:
    size = _size_arg(argument, value) if value is not None else None
    if size is not None and size < MIN_MEMORY_BUDGET:
        raise _bad(argument, value,
                   f"is {format_size(size)}, below the lab's floor of {format_size(MIN_MEMORY_BUDGET)}: a "
                   "Python process with torch needs more than that before your code runs, so the run would "
                   "be killed at start-up; give e.g. '600M'")
    return size


def _shm(argument: str, value: Any) -> Optional[int]:
    size = _size_arg(argument, value) if value is not None else None
    if size is not None and size < 64 * 1024:
        raise _bad(argument, value, "is below 64 KiB; give e.g. '8M'")
    return size


def _nofile(argument: str, value: Any) -> Optional[int]:
    count = _int_arg(argument, value, 16, "Python needs a few fds")
    hard = _hard_nofile()
    if count is not None and hard is not None and count > hard:
        raise _bad(argument, value, f"is above this machine's hard limit of {hard} open files "
                   f"(`ulimit -Hn`); give at most {hard}")
    return count


def _listener(argument: str, value: Any) -> Optional[Callable]:
    if value is not None and not callable(value):
        raise _bad(argument, value, "give a function that takes one dict")
    return value


@dataclass(frozen=True)
class Option:
    """One row of :data:`OPTIONS`. ``check(name, value)`` returns the value the run uses or raises
    :class:`IsolationError`; ``parse`` turns a command line's text into the value before ``check`` sees it
    (``bool``: a switch; ``dict``: ``KEY=VALUE``, repeatable). ``report``: shown in ``result.options``."""

    name: str
    type: str
    default: Any
    flag: Optional[str]
    help: str
    check: Callable[[str, Any], Any] = _given
    parse: type = str
    metavar: Optional[str] = None
    report: bool = False


def _metavar(choices: tuple) -> str:
    return "{" + ",".join(choices) + "}"


#: The run options, in ``run_isolated``'s order (after ``code``, the cell's text).
OPTIONS = (
    Option("file", "Optional[Target]", None, None, "a script to run unchanged (with argv), as python runs it"),
    Option("func", "Union[Callable, str, None]", None, None,
           "a module-level callable or 'module:function', called with args and kwargs; its JSON-able return "
           "value is kept"),
    Option("args", "Sequence[Any]", (), None, "positional arguments for func (JSON values)"),
    Option("kwargs", "Optional[Mapping[str, Any]]", None, None, "keyword arguments for func (JSON values)"),
    Option("argv", "Sequence[str]", (), None, "the script's sys.argv[1:]", _argv_arg),
    Option("start_method", "Optional[str]", None, "--start-method",
           "fork, spawn or forkserver, made the run's multiprocessing default (not set: the script may still "
           "call set_start_method); Python's default where not given", _start_method,
           metavar=_metavar(START_METHODS), report=True),
    Option("timeout", "Optional[float]", 60.0, "--timeout",
           "seconds before every process of the run is SIGKILLed (outcome timed_out), after a Python stack "
           "dump of the main process and each DataLoader worker (result.stacks); None waits forever",
           _seconds, float, "SECONDS", report=True),
    Option("memory_budget", "Union[int, str, None]", None, "--memory-budget",
           "memory limit of the whole run, bytes or a size such as 600M (at least 64 MiB): the kernel's OOM "
           "killer in a cgroup of the run's own where the OS allows, else the lab's watchdog SIGKILLs the "
           "largest process when the run's summed PSS exceeds it (result.memory_limit says which)",
           _budget, metavar="SIZE", report=True),
    Option("shm_size", "Union[int, str, None]", None, "--shm-size",
           "a private tmpfs of that size on the run's /dev/shm (e.g. 8M; a Linux mount namespace); where the "
           "OS refuses, the outcome is unsupported with the reason and nothing runs",
           _shm, metavar="SIZE", report=True),
    Option("nofile", "Optional[int]", None, "--nofile",
           "the run's soft RLIMIT_NOFILE (open files; at least 16, at most the hard limit)",
           _nofile, int, "N", report=True),
    Option("env", "Optional[Mapping[str, str]]", None, "--env", "extra environment variables of the run",
           _env_arg, dict, "KEY=VALUE", report=True),
    Option("notebook_main", "bool", False, "--notebook-main",
           "run the code (or the file's text) in a __main__ without __file__, as a notebook or python -c "
           "does: spawn and forkserver workers cannot import classes defined there", _flag, bool, report=True),
    Option("max_processes", "Optional[int]", None, "--max-processes",
           "at most that many tasks (processes and threads, as the kernel counts them) in the run at once, so "
           "that a fork beyond it is refused (BlockingIOError, errno 11): a pids cgroup where the lab may "
           "make one, else RLIMIT_NPROC (not for root), else the outcome is unsupported",
           partial(_int_arg, low=MIN_MAX_PROCESSES, why="the run's main process and its threads"), int, "N",
           report=True),
    Option("cwd", "Optional[Target]", None, None, "the folder the run starts in (and where a relative file is)",
           _cwd_arg),
    Option("sample_interval", "float", 0.05, None, "seconds between the monitor's samples (0.01 to 60)",
           partial(_seconds, low=0.01, high=60.0, none_ok=False), float),
    Option("memory_detail", "bool", False, "--memory-detail",
           "also sample every process's USS and PSS into result.samples (costlier; for the memory lessons)",
           _flag, bool),
    Option("python", "Optional[str]", None, None, "the interpreter of the run (default: this one)", _python_arg),
    Option("memory_enforcement", "Optional[str]", None, "--memory-enforcement",
           f"who enforces memory_budget: auto, kernel (the outcome is unsupported where impossible) or "
           f"watchdog; default {MEMORY_ENFORCEMENT_ENV}, else auto",
           _choice(MEMORY_ENFORCEMENTS, MEMORY_ENFORCEMENT_ENV), metavar=_metavar(MEMORY_ENFORCEMENTS),
           report=True),
    Option("stall", "Optional[float]", None, "--stall",
           "seconds without a delivered batch, while a DataLoader worker is alive, before the run is stopped "
           "as at its timeout (result.stall says how many batches came and how long it was idle)",
           _seconds, float, "SECONDS", report=True),
    Option("on_sample", "Optional[Callable[[dict], Any]]", None, None,
           "called from the monitor thread with each sample of each process (described above)", _listener),
    Option("on_event", "Optional[Callable[[dict], Any]]", None, None,
           "called for each process death seen (described above)", _listener),
    Option("launcher", "Optional[str]", None, "--launcher",
           f"auto (start from a warm template that has imported torch where that equals a fresh process, else "
           f"cold), cold (always a fresh interpreter) or warm (refuse runs that cannot start warm); default "
           f"{LAUNCHER_ENV}, else auto", _choice(LAUNCHERS, LAUNCHER_ENV), metavar=_metavar(LAUNCHERS),
           report=True),
)
_BY_NAME = {o.name: o for o in OPTIONS}
#: run_isolated's keywords and their defaults (besides ``code``)
KEYWORDS = {o.name: o.default for o in OPTIONS}


def option(name: str) -> Option:
    """The row of one option: ``option("shm_size").flag == "--shm-size"``."""
    return _BY_NAME[name]


def _with_options(cls):
    """Give the class one field per row of :data:`OPTIONS`, after its own (for :func:`dataclass`)."""
    for row in OPTIONS:
        cls.__annotations__[row.name] = row.type
        setattr(cls, row.name, row.default)
    return cls


@dataclass
@_with_options
class RunSpec:
    """One isolated run, validated: what to run (``mode``: "code", "file" or "func"), and a field per row of
    :data:`OPTIONS` holding the checked value (``file`` the script's absolute path, ``func`` a tuple
    ``(module, qualname, source file)``, ``memory_budget`` and ``shm_size`` in bytes, ``env`` a dict)."""

    mode: str
    code: Optional[str] = None
    lab_default: Optional[str] = None  # the start method LABUTILS_START_METHOD asks for

    @classmethod
    def build(cls, code=None, **keywords) -> "RunSpec":
        """Check every keyword of ``run_isolated`` (same names, same defaults, same meaning: see
        :data:`OPTIONS`); raise IsolationError naming the first bad one."""
        unknown = sorted(set(keywords) - set(KEYWORDS))
        if unknown:
            raise TypeError(f"run_isolated() got unexpected keyword arguments: {', '.join(unknown)}")
        given = {**KEYWORDS, **keywords}
        if sum(given[name] is not None for name in ("file", "func")) + (code is not None) != 1:
            raise IsolationError("give exactly one of code=, file= or func=")
        values = {row.name: row.check(row.name, given[row.name]) for row in OPTIONS}
        try:
            lab_default = _startmethod.requested()
        except ValueError as exc:
            raise IsolationError(str(exc)) from None
        mode = "code" if code is not None else "file" if values["file"] is not None else "func"
        spec = cls(mode=mode, lab_default=lab_default, **values)
        spec._target(code)
        return spec

    def _target(self, code) -> None:
        if self.notebook_main and self.mode == "func":
            raise IsolationError("notebook_main=True needs code= or file=, not func=")
        if self.mode == "code":
            if not isinstance(code, str):
                raise _bad("code", code, "give the cell's text as a str")
            _cell_bytes(code)  # a bad coding cookie is refused now, not after the run dir exists
            self.code = code
        elif self.mode == "file":
            text = _path_arg("file", self.file)
            path = os.path.abspath(os.path.join(self.cwd or os.getcwd(), text))
            if os.path.isdir(path):
                raise _bad("file", text, "is a directory; give the script's .py file")
            if not os.path.isfile(path):
                raise _bad("file", text, "does not exist" + (f" in cwd={self.cwd}" if self.cwd and not
                                                             os.path.isabs(text) else "") + "; check the path")
            self.file = path
        else:
            self.func = _resolve_func(self.func)
            self.args, self.kwargs = list(self.args), dict(self.kwargs or {})
            try:
                json.dumps([self.args, self.kwargs])
            except (TypeError, ValueError) as exc:
                raise IsolationError(f"args/kwargs must be JSON values (numbers, strings, lists): {exc}") from None

    def options(self) -> dict:
        """The run's settings as ``result.options`` reports them."""
        out = {row.name: getattr(self, row.name) for row in OPTIONS if row.report}
        out.update(env=dict(self.env), lab_default_start_method=self.lab_default)
        return out


def takes_run_options(func: Callable) -> Callable:
    """Give ``func(code=None, **options)`` the table's keywords as its signature, and the table's help as
    the list of keywords in its docstring (what ``help(run_isolated)`` and a notebook's ``?`` show)."""
    first = inspect.Parameter("code", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                              annotation="Optional[str]")
    rest = [inspect.Parameter(row.name, inspect.Parameter.KEYWORD_ONLY, default=row.default, annotation=row.type)
            for row in OPTIONS]
    func.__signature__ = inspect.signature(func).replace(parameters=[first, *rest])
    lines = [textwrap.fill(f"* ``{row.name}`` (default ``{row.default!r}``): {row.help}", 108,
                           initial_indent="    ", subsequent_indent="      ") for row in OPTIONS]
    func.__doc__ = (func.__doc__ or "") + "\n    Keywords (:data:`labutils.runner.spec.OPTIONS`):\n\n" + \
        "\n".join(lines) + "\n"
    return func


class _KeyValue(argparse.Action):
    """``--env KEY=VALUE``, repeatable, into one dict."""

    def __call__(self, parser, namespace, text, option_string=None):
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise argparse.ArgumentError(self, f"{text!r}: give KEY=VALUE")
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest, None) or {}), key: value})


def add_run_options(parser, names: Optional[Iterable[str]] = None, **defaults) -> None:
    """Add to an argparse ``parser`` the flag of each option in ``names`` (default: every row with a flag).

    A keyword overrides an option's default for this front end (``timeout=None``); an option neither given
    on the command line nor defaulted here is left out of the namespace, so run_isolated's own default
    applies. Values are converted only (``--nofile x`` is argparse's error); they are checked by
    :meth:`RunSpec.build`, whose :class:`IsolationError` names the flag with ``exc.for_option()``."""
    rows = [row for row in OPTIONS if row.flag] if names is None else [option(name) for name in names]
    for row in rows:
        if row.flag is None:
            raise ValueError(f"run option {row.name!r} has no command-line flag")
        default = defaults.get(row.name, argparse.SUPPRESS)
        shown = defaults.get(row.name, row.default)
        kw: dict = {"dest": row.name, "default": default,
                    "help": row.help + ("" if shown in (None, False) else f" (default: {shown})")}
        if row.parse is bool:
            kw["action"] = "store_true"
        elif row.parse is dict:
            kw.update(action=_KeyValue, metavar=row.metavar)
        else:
            kw.update(type=row.parse, metavar=row.metavar)
        parser.add_argument(row.flag, **kw)


def whole_number(least: int) -> Callable[[str], int]:
    """An argparse type for a front end's own counts: a whole number of at least ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    return parse


def run_options(namespace: argparse.Namespace) -> dict:
    """The run_isolated keywords in a namespace parsed with :func:`add_run_options`:
    ``run_isolated(file=args.script, **run_options(args))``."""
    return {row.name: getattr(namespace, row.name) for row in OPTIONS if hasattr(namespace, row.name)}
