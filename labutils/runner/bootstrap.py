"""Entry point of an isolated run: ``python bootstrap.py RUN_DIR``.

This file is executed by path (never imported as part of the package), so that starting a run costs
no more than starting Python: it imports nothing heavy and leaves torch to the learner's code.

It reads ``RUN_DIR/config.json``, joins the run's cgroups first (everything it starts inherits them),
applies the settings that must be applied from inside the process (rlimits, start method), then runs the
learner's code: a ``file`` as ``python script.py`` does (:func:`_run_as_main`: an unguarded script
springs the missing-guard trap as there), a ``func`` with this bootstrap as ``__main__`` (so spawn children
never re-run learner code), or ``notebook_main`` code in a ``__main__`` without ``__file__``, as a notebook
has. DataLoader workers run their target through ``_labutils_child.run`` (``child.py``), so that their
hooks are registered under spawn and forkserver too. Evidence is written to RUN_DIR (the names in
``rundir``) as it happens, so that a run killed from outside still leaves it.
"""

from __future__ import annotations

import sys

#: what the interpreter imported before this file (in a warm run: before the template's own start)
_AT_START = globals().get("_TEMPLATE_AT_START") or frozenset(sys.modules)

import atexit  # noqa: E402
import builtins  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

_HERE = os.path.abspath(__file__)  # read once: at the teardown the module's ``__file__`` may be gone
#: the lab's files whose frames a run's reported tracebacks leave out: this one and the copy of child.py
_OWN = {_HERE}


def _by_path(name: str, folder: str = ""):
    """A module of this folder (or of ``folder`` beside it), loaded by path (importing the package would cost
    the run its start-up)."""
    import importlib.util

    here = os.path.join(os.path.dirname(_HERE), folder)
    spec = importlib.util.spec_from_file_location("_labutils_" + name, os.path.join(here, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_rd = _by_path("rundir")  # the run directory's file names
#: type, message, link and traceback of an exception and every ``__cause__``/``__context__`` below it
_chain = _by_path("chain", os.path.join(os.pardir, "diagnosis")).records
RUN_DIR = sys.argv[1]
MAIN_PID = os.getpid()
_started = []  # BaseProcess objects started by the main process


def _join_cgroup(procs_file: str) -> None:
    """Move this process into the run's cgroup (``cgroup.procs`` or v1 ``tasks``) before anything else."""
    try:
        with open(procs_file, "w", encoding="ascii") as fh:
            fh.write(str(os.getpid()))
    except OSError as exc:
        print(f"{_rd.JOIN_FAILED_TEXT} ({procs_file}: {exc.strerror}); the run did not start", file=sys.stderr)
        sys.exit(_rd.JOIN_FAILED)


def _start_ticks(pid: int):
    """Start time of ``pid`` in clock ticks since boot (/proc/PID/stat field 22): its identity with the pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _append(name: str, record: dict) -> None:
    import _labutils_child

    _labutils_child.append(RUN_DIR, name, record)


def _record_exit_of(popen_class) -> None:
    """Patch a multiprocessing Popen class so that the exit status the main process reaps is recorded
    (``exits.jsonl``): a dead worker is reaped within milliseconds, before the runner could read it."""
    original = popen_class.__dict__.get("poll")
    if original is None:
        for base in popen_class.__mro__[1:]:
            if "poll" in base.__dict__:
                _record_exit_of(base)
                return
        return
    if getattr(original, "_labutils_wrapped", False):
        return

    def poll(self, *args, **kwargs):
        code = original(self, *args, **kwargs)
        if code is not None and not getattr(self, "_labutils_exit_logged", False) and os.getpid() == MAIN_PID:
            self._labutils_exit_logged = True
            _append(_rd.EXITS, {"pid": self.pid, "exitcode": code, "t": time.time()})
        return code

    poll._labutils_wrapped = True
    popen_class.poll = poll


def _track_processes() -> None:
    from multiprocessing import process

    original_start = process.BaseProcess.start

    def start(self):
        target = getattr(self, "_target", None)  # start() deletes it
        qualname = getattr(target, "__qualname__", repr(target))
        if target is not None and qualname.endswith("_worker_loop"):
            # a DataLoader worker: register its stack dump and semaphore record first, whatever the
            # start method (spawn/forkserver workers never run this bootstrap)
            import functools

            import _labutils_child

            self._target = functools.partial(_labutils_child.run, RUN_DIR, target)
        original_start(self)
        if os.getpid() != MAIN_PID:
            return
        _record_exit_of(type(self._popen))
        _started.append(self)
        _append(_rd.PROCS, {
            "pid": self.pid, "name": self.name, "t": time.time(), "start_ticks": _start_ticks(self.pid),
            "target": qualname, "method": type(self).__name__,
        })

    process.BaseProcess.start = start


def _watch_dataloader() -> None:
    """Record every DataLoader iterator's creation, errors and progress (``loader.jsonl``), from when
    torch.utils.data.dataloader is imported (no import here)."""
    import _labutils_child

    def patch(module):
        try:
            _labutils_child.watch_loaders(module, lambda record: _append(_rd.LOADER, record), _chain, MAIN_PID)
            _watch_sigchld()
        except Exception as exc:  # noqa: BLE001 - never break the learner's import
            _append(_rd.LOADER, {"event": "patch_failed", "error": repr(exc)})

    _labutils_child.when_imported("torch.utils.data.dataloader", patch)


def _watch_sigchld() -> None:
    """Record the worker death PyTorch's SIGCHLD handler raises: it can fire between two ``next()`` calls,
    outside any wrapper, and a script that catches it would leave no trace otherwise."""
    try:
        from torch.utils.data._utils import signal_handling
    except Exception:  # noqa: BLE001 - evidence is best effort
        return
    original = signal_handling._error_if_any_worker_fails
    if getattr(original, "_labutils_wrapped", False):
        return

    def checked():
        try:
            original()
        except BaseException as exc:
            if os.getpid() == MAIN_PID:  # "sigchld_error": the diagnosis reads the chains below it instead
                _append(_rd.LOADER, {"event": "sigchld_error", "t": time.time(), "chain": _chain(exc)})
            raise

    checked._labutils_wrapped = True
    signal_handling._error_if_any_worker_fails = checked


_exit_code = [0]  # what the script's end means for the exit status, for final.json


def _finish() -> None:
    """The last exit handler (registered first): record the exit status of every process the main process
    started. multiprocessing's own handler has joined them by now (it runs before this one), so the join
    below waits only for a child that handler does not know of."""
    records = []
    for proc in _started:
        exitcode = None
        try:
            proc.join(0.5)
            exitcode = proc.exitcode
        except Exception:  # noqa: BLE001 - a process object in a strange state
            pass
        records.append({"pid": proc.pid, "name": proc.name, "exitcode": exitcode})
    try:
        with open(os.path.join(RUN_DIR, _rd.FINAL), "w", encoding="utf-8") as fh:
            json.dump({"exit": _exit_code[0], "processes": records}, fh)
    except OSError:
        pass


def _die_with_runner() -> None:
    """Linux: this process gets SIGKILL when the runner that started it dies (a killed ``diagnose`` command,
    a crashed kernel), so a run never outlives its runner; its workers follow through their own watchdogs
    and the runner's clean-up of the process group is not needed."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the runner died before the line above
        os._exit(1)


def _apply_limits(cfg: dict) -> None:
    """The run's cgroups first (everything started later inherits them), then its rlimits."""
    if cfg.get("cgroup_procs"):
        _join_cgroup(cfg["cgroup_procs"])
    if cfg.get("pids_procs"):  # max_processes: the run's pids cgroup
        _join_cgroup(cfg["pids_procs"])

    if cfg.get("nofile"):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        n = int(cfg["nofile"])
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard if hard == resource.RLIM_INFINITY or hard >= n else n))
    if cfg.get("nproc"):  # max_processes without a cgroup: the user's tasks now + the run's allowance
        import resource

        resource.setrlimit(resource.RLIMIT_NPROC, (int(cfg["nproc"]), resource.getrlimit(resource.RLIMIT_NPROC)[1]))


def main() -> None:
    """Prepare the process, then run the learner's code; what escapes it is reported as python reports it."""
    atexit.register(_finish)  # first: it runs last, once every other exit handler has run
    _pending[:] = globals().pop("_TEMPLATE_EXIT_HANDLERS", ())  # a warm run's: see _follow_imports
    if _pending:
        atexit.register(_run_pending, _pending)  # second: what never fell due runs before _finish
    _die_with_runner()
    with open(os.path.join(RUN_DIR, _rd.CONFIG), encoding="utf-8") as fh:
        cfg = json.load(fh)
    _apply_limits(cfg)
    # The runner sends SIGUSR1 before a hard kill (time limit, stall): where was each process stuck?
    sys.path.append(os.path.join(RUN_DIR, _rd.PY))  # _labutils_child, also for spawn/forkserver workers
    import _labutils_child

    _OWN.add(os.path.abspath(_labutils_child.__file__))
    _labutils_child.register_stacks(RUN_DIR)
    _labutils_child.record_semaphores(RUN_DIR)
    _labutils_child.record_temp_dirs(RUN_DIR)
    _track_processes()
    _watch_dataloader()
    startmethod = _by_path("startmethod")
    # the lab's switch: a changed default, not a set one
    startmethod.apply_requested(emulate_preload=_labutils_child.when_imported)
    if cfg.get("start_method"):  # the run's own choice wins over the switch, and is a default too: the
        startmethod.set_default(cfg["start_method"])  # script may still set_start_method()
    # decided for this process and its forks: the script's own `import labutils` must not apply the switch
    # again over the run's choice (it does in the interpreters this one starts)
    startmethod.mark_decided()
    _follow_imports()
    sys.unraisablehook = _Unraisable(sys.unraisablehook)
    _run_target(cfg)


_pending: list = []  # a warm run's template exit handlers not registered again yet: see _follow_imports


def _follow_imports() -> None:
    """Make the modules imported before the script (by this bootstrap, or the warm template) take their
    place as the script imports them, as in ``python script.py``: their place in ``sys.modules`` (the
    teardown clears modules in its reverse order, so a destructor run as one module is cleared finds those
    the script imported before it still whole, as under python), and, warm, the exit handlers that the
    template's imports registered: each is registered again when the script imports a module whose import
    registered it, so it runs before or after the script's own as under python (any never due: at the end).
    A wrapper of ``builtins.__import__`` does it, until every such module is imported; its frame is this
    file's, dropped from the tracebacks the run reports (:func:`_own_frames_dropped`)."""
    early, pending = dict.fromkeys(m for m in sys.modules if m not in _AT_START), _pending
    original = builtins.__import__

    def take_place(name: str) -> None:
        if name not in early:
            return
        group = [name, *(m for m in early if m.startswith(name + "."))]
        for m in group:
            del early[m]
            module = sys.modules.pop(m, None)
            if module is not None:
                sys.modules[m] = module
        for handler in [h for h in pending if any(m in h[0] for m in group)]:
            pending.remove(handler)
            atexit.register(handler[1], *handler[2], **handler[3])

    def __import__(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002 - its signature
        module = original(name, globals, locals, fromlist, level)
        base = _absolute(name, globals, level)
        if base:
            parts = base.split(".")
            for i in range(1, len(parts) + 1):
                take_place(".".join(parts[:i]))
            for item in fromlist or ():
                take_place(f"{base}.{item}")
        if not early and builtins.__import__ is __import__:
            builtins.__import__ = original
        return module

    if early:
        builtins.__import__ = __import__


def _absolute(name: str, globals_, level: int):
    """The absolute name of an import statement's module (``from . import x`` in package ``p``: ``p``)."""
    if not level:
        return name
    package = (globals_ or {}).get("__package__") or ""
    bits = package.rsplit(".", level - 1)
    if not package or len(bits) < level:
        return None
    return f"{bits[0]}.{name}" if name else bits[0]


def _run_pending(pending: list) -> None:
    """The template's exit handlers that the script's imports never made due, last registered first."""
    for _importing, func, args, kwargs in reversed(pending):
        try:
            func(*args, **kwargs)
        except Exception:  # noqa: BLE001 - as atexit does: report, go on
            traceback.print_exc()


def _run_as_main(path: str) -> None:
    """Run the file at ``path`` as ``python path`` does: its module is ``__main__`` and, as multiprocessing
    makes it on import, ``__mp_main__`` too. The second name matters under spawn and forkserver: a worker
    runs the script as ``__mp_main__``, so an object of a class the script defines comes back to this
    process pickled under that name (``runpy.run_path`` would leave ``__mp_main__`` naming this bootstrap,
    and unpickling it would fail with "Can't get attribute", as it never does under plain python). The module
    stays in ``sys.modules`` after the script, as python's does: its globals are alive while the exit handlers
    run, and are freed only by the interpreter's own teardown."""
    import runpy
    import zipfile

    if os.path.isdir(path) or (not path.endswith(".py") and zipfile.is_zipfile(path)):  # a __main__.py: runpy's
        runpy.run_path(path, run_name="__main__")
        return
    import types
    from importlib.machinery import SourceFileLoader

    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=path, __cached__=None, __loader__=SourceFileLoader("__main__", path),
                           __package__=None, __spec__=None, __builtins__=builtins, __annotations__={})
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    with open(path, "rb") as fh:
        source = fh.read()  # bytes: compile() honours a BOM or a coding cookie as python does
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the learner's script, as python runs it


def _run_target(cfg: dict) -> None:
    """Run the learner's code as the config asks. An exception that escapes it is recorded (``exc.json``),
    then reported and turned into the exit status exactly as python does for its main module (see
    :func:`_uncaught`)."""
    mode = cfg["mode"]
    try:
        if mode == "file":
            path = cfg["path"]
            sys.argv = [path, *cfg.get("argv", [])]
            sys.orig_argv = [sys.orig_argv[0], *sys.argv] if sys.orig_argv else list(sys.argv)
            sys.path[0] = os.path.dirname(os.path.realpath(path))  # python resolves a symlinked script
            _run_as_main(path)
        elif mode == "func":
            import importlib

            sys.path[0] = cfg.get("sys_path0") or os.getcwd()
            sys.argv = [cfg["module"], *cfg.get("argv", [])]
            obj = importlib.import_module(cfg["module"])
            for part in cfg["qualname"].split("."):
                obj = getattr(obj, part)
            value = obj(*cfg.get("args", []), **cfg.get("kwargs", {}))
            if value is not None:
                with open(os.path.join(RUN_DIR, _rd.VALUE), "w", encoding="utf-8") as fh:
                    json.dump(value, fh, default=repr)
        elif mode == "notebook_main":
            import types

            path = cfg["path"]
            sys.argv = [""]  # what a notebook or ``python -c`` has
            sys.path[0] = os.path.dirname(os.path.abspath(path))
            module = types.ModuleType("__main__")
            module.__dict__["__builtins__"] = builtins
            sys.modules["__main__"] = module  # no __file__ and no __spec__: like a notebook
            with open(path, "rb") as fh:
                source = fh.read()  # bytes: compile() honours a BOM or a coding cookie as python does
            exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - this is the point
        else:
            raise SystemExit(f"labutils: unknown mode {mode!r}")
    except SystemExit as exc:
        code = exc.code
        _exit_code[0] = 0 if code is None else code if isinstance(code, int) else 1
        raise  # python prints a code that is not an int and exits with the status
    except BaseException as exc:  # noqa: BLE001 - report everything, like the interpreter would
        try:
            _uncaught(exc)
        except Exception:  # noqa: BLE001
            # PyTorch's SIGCHLD report, its signal pending as _uncaught began, before _reports_held could hold
            # it: dropped, as inside it, and the script's exception reported, once
            if _printed:
                raise
            _uncaught(exc)


def _own_frames_dropped(tb):
    """The traceback without the lab's entries (:data:`_OWN`): the frames that run the script (above its
    first one) and the wrappers around DataLoader methods (among PyTorch's), none of which ``python
    script.py`` has."""
    head = prev = None
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) not in _OWN:
            if prev is None:
                head = tb
            else:
                prev.tb_next = tb
            prev = tb
        tb = tb.tb_next
    if prev is not None:
        prev.tb_next = None
    return head


def _without_own_frames(exc: BaseException) -> None:
    """:func:`_own_frames_dropped` for ``exc`` and every exception chained to it."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.with_traceback(_own_frames_dropped(exc.__traceback__))
        exc = exc.__cause__ if exc.__cause__ is not None else exc.__context__


def _uncaught(exc: BaseException) -> None:
    """What python does with an exception that ends its main module, here for the script's: the chain is
    written down (``exc.json``), ``sys.last_*`` keep it (and the failed frames' objects) alive until the
    teardown, ``sys.excepthook`` prints it with the script's frames only, and the exit status is 1, or for
    a KeyboardInterrupt a death by SIGINT after the teardown (python's own way out, re-raised here)."""
    with _reports_held():
        _without_own_frames(exc)
        _record_chain(exc)
    kind, tb = type(exc), exc.__traceback__
    sys.last_type, sys.last_value, sys.last_traceback = kind, exc, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    hook = getattr(sys, "excepthook", None)
    _printed.append(True)
    if hook is None:
        print("sys.excepthook is missing", file=sys.stderr)
        sys.__excepthook__(kind, exc, tb)
    else:
        try:
            hook(kind, exc, tb)
        except BaseException as error:  # noqa: BLE001 - python's words for a hook that fails
            print("Error in sys.excepthook:", file=sys.stderr)
            sys.__excepthook__(type(error), error, _own_frames_dropped(error.__traceback__))
            print("\nOriginal exception was:", file=sys.stderr)
            sys.__excepthook__(kind, exc, tb)
    _exit_code[0] = 1
    if isinstance(exc, KeyboardInterrupt):
        _exit_code[0] = -2
        sys.excepthook = _Silent(hook)  # reported already: python's re-report of it prints nothing
        raise exc
    del exc, tb
    raise SystemExit(1)


class _Unraisable:
    """``sys.unraisablehook`` with this file's frames dropped first, as :func:`_uncaught` does for the
    script's own exception: an exception Python reports as ignored (in an exit handler, a ``__del__``) can
    pass through the lab's recorders (multiprocessing's wait, PyTorch's SIGCHLD check), which
    ``python script.py`` does not have. The chain is edited in place; the hook it wraps prints it."""

    def __init__(self, hook):
        self.hook = hook

    def __call__(self, unraisable):
        if unraisable.exc_value is not None:
            _without_own_frames(unraisable.exc_value)
        _own_frames_dropped(unraisable.exc_traceback)  # its head is the handler's frame, never this file's
        self.hook(unraisable)


class _Silent:
    """An excepthook that prints nothing once, then puts the script's own back."""

    def __init__(self, hook):
        self.hook = hook

    def __call__(self, *args):
        sys.excepthook = self.hook


def _record_chain(exc: BaseException) -> None:
    """``exc.json``: the chain, as the diagnosis reads it."""
    try:
        with open(os.path.join(RUN_DIR, _rd.EXC), "w", encoding="utf-8") as fh:
            json.dump(_chain(exc), fh, default=repr)
    except Exception:  # noqa: BLE001, S110 - evidence is best effort
        pass


_printed: list = []  # the script's exception has gone to sys.excepthook (see _run_target)


class _reports_held:
    """While the lab writes down the script's exception, PyTorch's SIGCHLD handler (for a worker that died
    just now, or whose signal was already pending) runs with its report dropped: raised inside the write, it
    lost the record (2 runs in 40 of notebook 01's staged kill, on a loaded machine). Under python that moment
    is C code (the traceback's printing), and the report would come at the first Python code after it."""

    def __enter__(self):
        import signal

        self.previous = signal.getsignal(signal.SIGCHLD) if hasattr(signal, "SIGCHLD") else None
        if callable(self.previous):
            try:
                signal.signal(signal.SIGCHLD, self._held)
            except Exception:  # noqa: BLE001, S110 - a pending report, run as the handler changed: dropped
                pass
        return self

    def _held(self, signum, frame) -> None:
        try:
            self.previous(signum, frame)
        except Exception:  # noqa: BLE001, S110 - the report, dropped (see the class)
            pass

    def __exit__(self, *exc_info) -> None:
        if callable(self.previous):
            import signal

            signal.signal(signal.SIGCHLD, self.previous)


if __name__ == "__main__":
    main()
