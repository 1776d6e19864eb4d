"""Who made this file? Loaded by every Python process of a lab pytest session.

The lab's pytest plugin (``labsuite.pytest_plugin``) puts this folder on ``PYTHONPATH`` and names a
session ledger in ``LABUTILS_SESSION_LEDGER``. Every Python process that starts below the session (test
processes, Jupyter kernels, isolated runs, spawn workers) and every process forked from one of them then
appends to the ledger, as it happens:

* its own pid and start time (``/proc/self/stat``), and the test that was running (``PYTEST_CURRENT_TEST``);
* each named multiprocessing semaphore it creates (``sem.mp-*`` in /dev/shm), with its inode;
* each temporary file or folder it creates through :mod:`tempfile`, with its inode.

At the end of the session the plugin blames a file that is still there only on this record: a neighbour's
file (another session, another user's notebook) is never named. Nothing here changes what a process does;
every write is one ``O_APPEND`` line, and a failure to write is ignored. Stdlib only. A ``sitecustomize``
later on ``sys.path`` (the outside-start-method switch in ``tests/outside_start_method``) still runs.
"""

import os
import sys

_LEDGER = os.environ.get("LABUTILS_SESSION_LEDGER")


def _json(value):
    """JSON for the str, int and None values of a record, with no import (this also runs in a freshly
    forked child, where importing is best avoided)."""
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    text = "".join(c if c >= " " else " " for c in str(value))
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _note(kind, **fields):
    fields.update(kind=kind, pid=os.getpid(), test=os.environ.get("PYTEST_CURRENT_TEST"))
    line = "{" + ", ".join(f"{_json(k)}: {_json(v)}" for k, v in fields.items()) + "}\n"
    try:
        fd = os.open(_LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except (OSError, TypeError, ValueError):
        pass


def _note_process():
    try:
        with open("/proc/self/stat", "rb") as fh:
            ticks = int(fh.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/self/cmdline", "rb") as fh:
            cmd = " ".join(fh.read().replace(b"\0", b" ").decode(errors="replace").split())[:200]
    except (OSError, ValueError, IndexError):
        ticks, cmd = None, ""
    _note("process", ticks=ticks, cmd=cmd)


def _ino(path):
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _wrap_semlock(module):
    cls = getattr(module, "SemLock", None)
    if cls is None or getattr(cls.__init__, "_labutils_session", False):
        return
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        name = getattr(getattr(self, "_semlock", None), "name", None)
        if name:
            entry = "sem." + name.lstrip("/")
            _note("sem", name=entry, ino=_ino(os.path.join("/dev/shm", entry)))

    __init__._labutils_session = True
    cls.__init__ = __init__


def _wrap_tempfile(module):
    if getattr(module.mkdtemp, "_labutils_session", False):
        return
    mkdtemp, mkstemp_inner = module.mkdtemp, module._mkstemp_inner

    def recorded_mkdtemp(*args, **kwargs):
        path = mkdtemp(*args, **kwargs)
        _note("tmp", path=os.path.abspath(os.fsdecode(path)), ino=_ino(path))
        return path

    def recorded_mkstemp_inner(*args, **kwargs):
        fd, path = mkstemp_inner(*args, **kwargs)
        _note("tmp", path=os.path.abspath(os.fsdecode(path)), ino=_ino(path))
        return fd, path

    recorded_mkdtemp._labutils_session = True
    module.mkdtemp, module._mkstemp_inner = recorded_mkdtemp, recorded_mkstemp_inner


_HOOKS = {"multiprocessing.synchronize": _wrap_semlock, "tempfile": _wrap_tempfile}


class _Watch:
    """A meta path finder that lets the usual finders load a module, then wraps it (see ``_HOOKS``)."""

    def find_spec(self, name, path=None, target=None):
        hook = _HOOKS.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module, _run=run, _hook=hook):
                    _run(module)
                    try:
                        _hook(module)
                    except Exception:  # noqa: BLE001  the record is best effort; the import must not fail
                        pass

                spec.loader.exec_module = exec_module
                return spec
            if spec is not None:
                return spec
        return None


def _install():
    _note_process()
    os.register_at_fork(after_in_child=_note_process)
    for name, hook in _HOOKS.items():
        if name in sys.modules:
            hook(sys.modules[name])
    sys.meta_path.insert(0, _Watch())


def _chain():
    """Run the next ``sitecustomize`` on ``sys.path``, as if this one were not there."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if _LEDGER:
    try:
        _install()
    except Exception:  # noqa: BLE001  never break the interpreter's start
        pass
if __name__ == "sitecustomize":  # loaded by the interpreter, not by the plugin for its own process
    _chain()
