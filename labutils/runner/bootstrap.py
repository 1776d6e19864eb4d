"""Entry point of an isolated run: ``python bootstrap.py RUN_DIR``.

This file is executed by path (never imported as part of the package), so that starting a run costs
no more than starting Python: it imports nothing heavy and leaves torch to the learner's code.

It reads ``RUN_DIR/config.json``, applies the per-run settings that must be applied from inside the
process (RLIMIT_NOFILE, start method), then runs the learner's code the way the config asks:

* ``file``: like ``python script.py``: the file runs as ``__main__`` and spawn/forkserver children
  import it back as ``__mp_main__`` (so an unguarded script reproduces the missing-guard trap);
* ``func``: imports ``module`` and calls ``func(*args)``; ``__main__`` is this bootstrap, so spawn
  children never re-run learner code;
* ``notebook_main``: the source runs in a fresh ``__main__`` module that has no ``__file__``, exactly
  like a notebook or ``python -c``: spawn/forkserver children cannot import classes defined there.

Its first act, when the runner made a memory-limited cgroup for the run, is to move itself into it
(everything it starts inherits the group). DataLoader workers run their target through
``_labutils_child.run`` (a copy of ``labutils/runner/child.py`` in the run directory, importable without the
package), which registers their stack dump and semaphore record under spawn and forkserver too.

Evidence is written to RUN_DIR as it happens (so that a run killed from outside still leaves it):
``procs.jsonl`` (each process the main process starts), ``loader.jsonl`` (DataLoader iterators
created, ``init_error`` for every exception that escaped ``iter(loader)``, ``error`` for every one that
escaped ``next()``, even when the script catches them, and ``progress``: batches delivered per
iterator, at most about four records a second plus a last one), ``created_shm.jsonl`` (named
semaphores created by the run's processes), ``stacks/<pid>.txt`` (faulthandler dumps on SIGUSR1),
``exc.json`` (the exception chain that ended the script) and ``final.json`` (exit codes of the
processes it started).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import weakref


def _by_path(name: str):
    """A module of this folder, loaded by path (importing the package would cost the run its start-up)."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("_labutils_" + name, os.path.join(here, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_rd = _by_path("rundir")  # the run directory's file names
RUN_DIR = sys.argv[1]
MAIN_PID = os.getpid()
_started = []  # BaseProcess objects started by the main process
_PROGRESS_EVERY = 0.25  # seconds between two progress records of one iterator


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
    try:
        with open(os.path.join(RUN_DIR, name), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, default=repr) + "\n")
    except OSError:  # the run dir may be gone when a straggler writes late
        pass


def _chain(exc: BaseException) -> list:
    """Type, message and link of the exception and every ``__cause__``/``__context__`` below it.

    The same walk and records as ``labutils/diagnosis/chain.py`` (their one home for everything else):
    this copy stays because the bootstrap is run by path, before labutils can be imported, and each
    import costs every run its start-up time."""
    out, seen, link = [], set(), None
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False))
        out.append({"type": type(exc).__qualname__, "module": type(exc).__module__,
                    "message": str(exc), "link": link, "traceback": tb[-6000:]})
        if exc.__cause__ is not None:
            exc, link = exc.__cause__, "cause"
        elif exc.__context__ is not None and not exc.__suppress_context__:
            exc, link = exc.__context__, "context"
        else:
            exc = None
    return out


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


#: The main process's DataLoader iterators, shut down at the end of the script (see _shut_down_loaders).
_LIVE_ITERATORS = weakref.WeakSet()


def _shut_down_loaders() -> None:
    """Shut down every DataLoader iterator the script left alive (a persistent loader in a global), while
    everything it uses is still alive: what its ``__del__`` does when the last reference goes. Left to the
    garbage collector, an iterator in a reference cycle (a global of the script, whose functions point back
    to its globals) can be finalised after its own queues, so its workers never get the word to stop and
    PyTorch waits out a 5 s join per worker, then terminates them."""
    for it in list(_LIVE_ITERATORS):
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is None:
            continue
        try:
            shutdown()
        except Exception:  # noqa: BLE001, S110 - its __del__ would swallow it too
            pass


def _patch_dataloader(module) -> None:
    """Record every DataLoader iterator's creation, errors and progress (``loader.jsonl``)."""
    base = module._BaseDataLoaderIter
    original_next, original_init = base.__next__, base.__init__
    original_iter = module.DataLoader.__iter__
    counter = [0]

    def __iter__(self):
        try:
            return original_iter(self)
        except BaseException as exc:
            if os.getpid() == MAIN_PID:
                _append(_rd.LOADER, {"event": "init_error", "t": time.time(), "chain": _chain(exc)})
            raise

    def __init__(self, loader, *a, **kw):
        original_init(self, loader, *a, **kw)
        if os.getpid() != MAIN_PID:
            return
        counter[0] += 1
        self._labutils_iter, self._labutils_batches, self._labutils_last = counter[0], 0, 0.0
        _LIVE_ITERATORS.add(self)
        ctx = getattr(loader, "multiprocessing_context", None)
        try:
            import torch.multiprocessing as tmp
            strategy = tmp.get_sharing_strategy()
            method = ctx.get_start_method() if ctx is not None else tmp.get_start_method()
        except Exception:  # noqa: BLE001 - evidence is best effort
            strategy = method = None
        _append(_rd.LOADER, {
            "event": "iter", "t": time.time(), "iter": counter[0], "num_workers": loader.num_workers,
            "timeout": loader.timeout, "start_method": method, "sharing_strategy": strategy,
            "pin_memory": loader.pin_memory, "persistent_workers": loader.persistent_workers,
            "prefetch_factor": loader.prefetch_factor, "batch_size": loader.batch_size,
            "dataset": type(loader.dataset).__module__ + "." + type(loader.dataset).__qualname__,
        })

    def _progress(self, now: float) -> None:
        self._labutils_last = now
        _append(_rd.LOADER, {"event": "progress", "t": now, "batches": self._labutils_batches,
                                 "iter": self._labutils_iter})

    def __next__(self):
        try:
            data = original_next(self)
        except StopIteration:
            if getattr(self, "_labutils_iter", None) is not None:
                _progress(self, time.time())
            raise
        except BaseException as exc:
            if os.getpid() == MAIN_PID:
                _append(_rd.LOADER, {"event": "error", "t": time.time(), "chain": _chain(exc)})
                if getattr(self, "_labutils_iter", None) is not None:
                    _progress(self, time.time())
            raise
        if getattr(self, "_labutils_iter", None) is not None:
            self._labutils_batches += 1
            now = time.time()
            if now - self._labutils_last >= _PROGRESS_EVERY:
                _progress(self, now)
        return data

    base.__init__, base.__next__ = __init__, __next__
    module.DataLoader.__iter__ = __iter__
    _watch_sigchld()


def _watch_dataloader() -> None:
    """Wrap DataLoader iterators when torch.utils.data.dataloader is imported (no import here)."""
    import importlib.abc
    import importlib.machinery

    target = "torch.utils.data.dataloader"
    patch = _patch_dataloader

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target_=None):
            if fullname != target:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            original_exec = spec.loader.exec_module

            def exec_module(module):
                original_exec(module)
                try:
                    patch(module)
                except Exception as exc:  # noqa: BLE001 - never break the learner's import
                    _append(_rd.LOADER, {"event": "patch_failed", "error": repr(exc)})

            spec.loader.exec_module = exec_module
            return spec

    if target in sys.modules:  # imported already (a run started by the warm template): patch it now
        patch(sys.modules[target])
        return
    sys.meta_path.insert(0, Finder())


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


def _lab_default_start_method() -> None:
    """Apply the lab's start-method switch (``LABUTILS_START_METHOD``) as a changed default, not a set one."""
    _by_path("startmethod").apply_requested(emulate_preload=True)


def _finish(code: int) -> None:
    """Record the exit status of every process the main process started."""
    records = []
    for proc in _started:
        exitcode = None
        try:
            proc.join(2.0)
            exitcode = proc.exitcode
        except Exception:  # noqa: BLE001 - a process object in a strange state
            pass
        records.append({"pid": proc.pid, "name": proc.name, "exitcode": exitcode})
    with open(os.path.join(RUN_DIR, _rd.FINAL), "w", encoding="utf-8") as fh:
        json.dump({"exit": code, "processes": records}, fh)


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


def main() -> int:
    _die_with_runner()
    with open(os.path.join(RUN_DIR, _rd.CONFIG), encoding="utf-8") as fh:
        cfg = json.load(fh)
    _apply_limits(cfg)
    # The runner sends SIGUSR1 before a hard kill (time limit, stall): where was each process stuck?
    sys.path.append(os.path.join(RUN_DIR, _rd.PY))  # _labutils_child, also for spawn/forkserver workers
    import _labutils_child

    _labutils_child.register_stacks(RUN_DIR)
    _labutils_child.record_semaphores(RUN_DIR)
    _labutils_child.record_temp_dirs(RUN_DIR)
    _track_processes()
    _watch_dataloader()
    if os.environ.get("LABUTILS_START_METHOD"):  # the lab's switch: a changed default, not a set one
        _lab_default_start_method()
    if cfg.get("start_method"):  # the run's own choice wins over the switch, and is a default too: the
        _by_path("startmethod").set_default(cfg["start_method"])  # script may still set_start_method()
    # decided for this process and its forks: the script's own `import labutils` must not apply the switch
    # again over the run's choice (it does in the interpreters this one starts)
    _by_path("startmethod").mark_decided()

    code, namespace = _run_target(cfg)
    # Stop the loaders the script kept, then drop the script's objects, so that the exit codes below are
    # final.
    _shut_down_loaders()
    if namespace is not None:
        namespace.clear()
    namespace = None
    import gc

    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    _finish(code)
    return code


def _is_zip(path: str) -> bool:
    import zipfile

    return zipfile.is_zipfile(path)


def _run_as_main(path: str) -> dict:
    """Run the file at ``path`` as ``python path`` does: its module is ``__main__`` and, as multiprocessing
    makes it on import, ``__mp_main__`` too. The second name matters under spawn and forkserver: a worker
    runs the script as ``__mp_main__``, so an object of a class the script defines comes back to this
    process pickled under that name (``runpy.run_path`` would leave ``__mp_main__`` naming this bootstrap,
    and unpickling it would fail with "Can't get attribute", as it never does under plain python). The module
    also outlives the script, as python's does: runpy's temporary module let the script's globals go as an
    exception left it, and their destructors then ran where python runs none (05's deleted /dev/shm files:
    plain python and this end with exit 1 or SIGABRT, runpy's way aborted in 10 runs of 10)."""
    import runpy

    if os.path.isdir(path) or (not path.endswith(".py") and _is_zip(path)):  # a __main__.py inside: runpy's job
        return runpy.run_path(path, run_name="__main__")
    import types

    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=path, __cached__=None, __loader__=None, __package__=None, __spec__=None,
                           __builtins__=__builtins__)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    with open(path, "rb") as fh:
        source = fh.read()  # bytes: compile() honours a BOM or a coding cookie as python does
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the learner's script, as python runs it
    return module.__dict__


def _run_target(cfg: dict) -> tuple:
    """Run the learner's code as the config asks; ``(exit code, its namespace or None)``."""
    mode = cfg["mode"]
    code = 0
    namespace = None
    try:
        if mode == "file":
            path = cfg["path"]
            sys.argv = [path, *cfg.get("argv", [])]
            sys.path[0] = os.path.dirname(os.path.abspath(path))
            namespace = _run_as_main(path)
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
            module.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = module  # no __file__ and no __spec__: like a notebook
            with open(path, "rb") as fh:
                source = fh.read()  # bytes: compile() honours a BOM or a coding cookie as python does
            exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - this is the point
            namespace = module.__dict__
        else:
            raise SystemExit(f"labutils: unknown mode {mode!r}")
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException as exc:  # noqa: BLE001 - report everything, like the interpreter would
        _quiet_sigchld()
        for _ in range(3):  # a worker's death reported by PyTorch's handler inside this report: write it again
            try:
                with open(os.path.join(RUN_DIR, _rd.EXC), "w", encoding="utf-8") as fh:
                    json.dump(_chain(exc), fh, default=repr)
                break
            except Exception:  # noqa: BLE001, S112
                continue
        traceback.print_exception(type(exc), exc, exc.__traceback__)
        code = 1
        # The traceback's frames keep the failed DataLoader iterator alive in a cycle; collected later,
        # it would wait out its workers' join timeouts (about 5 s each). Python itself exits at once.
        traceback.clear_frames(exc.__traceback__)
        del exc
    return code, namespace


def _quiet_sigchld() -> None:
    """The script has failed: PyTorch's SIGCHLD handler must not raise again, for another worker's exit,
    while the failure is being written down (it runs on any SIGCHLD, wherever the main thread is)."""
    import signal

    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    except (ValueError, OSError):  # not the main thread
        pass


def exit_now(code: int) -> None:
    """Exit as the interpreter would, less its final teardown: wait for non-daemon threads, run the atexit
    handlers (multiprocessing's joins its children and stops daemonic ones), flush stdio, then ``_exit``.

    Freeing every module of a process that imported torch takes 0.7-0.9 s here and shows nothing a learner
    could see: the script's objects were collected above (their ``__del__`` ran), and the exit code is the same.
    """
    import atexit
    import threading

    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - a closed stream: nothing left to write
                pass
        os._exit(code)


if __name__ == "__main__":
    exit_now(main())
