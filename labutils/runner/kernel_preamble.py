"""Loaded by path in the notebook's kernel as its first cell (not the learner's), by
:mod:`labutils.runner.notebook_runner`: the evidence the bootstrap records for a script, for a notebook.

DataLoader iterators, their progress and the exceptions that escape them go to the run's own
``loader.jsonl`` (so the runner sees progress and stalls in the kernel as in a script); the processes the
kernel starts, their exit codes and a failing cell's exception go under the run directory's ``kernel/``
folder (``LABUTILS_KERNEL_EVIDENCE``). It imports only the standard library: labutils may not be
importable in the kernel, and importing it would cost every notebook its start-up.
"""

import faulthandler
import importlib.abc
import importlib.machinery
import json
import multiprocessing
import os
import runpy
import signal
import sys
import time
import types
from multiprocessing import process

_HERE = os.path.dirname(os.path.abspath(__file__))
_rd = types.SimpleNamespace(**runpy.run_path(os.path.join(_HERE, "rundir.py")))  # the run directory's names
#: labutils/diagnosis/chain.py, the one home of the exception-chain walk
_chain = runpy.run_path(os.path.join(_HERE, os.pardir, "diagnosis", "chain.py"))["records"]
_PROGRESS_EVERY = 0.25  # seconds between two progress records of one iterator


class _Evidence:
    """Where the kernel's records go, and the processes it started."""

    def __init__(self):
        self.folder = os.environ["LABUTILS_KERNEL_EVIDENCE"]
        self.run_dir = os.environ["LABUTILS_RUN_DIR"]
        self.main_pid = os.getpid()
        self.started: list = []
        self.iterators = 0

    def append(self, name: str, record: dict, folder=None) -> None:
        try:
            with open(os.path.join(folder or self.folder, name), "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record, default=repr) + "\n")
        except OSError:
            pass

    def loader(self, record: dict) -> None:
        self.append(_rd.LOADER, record, self.run_dir)

    def write_exits(self) -> None:
        codes = {}
        for p in self.started:
            try:
                if p.exitcode is None:
                    p.join(0.05)
                codes[str(p.pid)] = p.exitcode
            except Exception:  # noqa: BLE001 - a process object in any state: its code is unknown
                codes[str(p.pid)] = None
        try:
            with open(os.path.join(self.folder, _rd.KERNEL_EXITS), "w", encoding="utf-8") as fh:
                json.dump(codes, fh)
        except OSError:
            pass


def _record_starts(ev: _Evidence) -> None:
    original_start = process.BaseProcess.start

    def start(self):
        target = getattr(self, "_target", None)
        original_start(self)
        if os.getpid() != ev.main_pid:
            return
        ev.started.append(self)
        ev.append(_rd.PROCS, {"pid": self.pid, "name": self.name, "t": time.time(),
                              "target": getattr(target, "__qualname__", repr(target))})

    process.BaseProcess.start = start


def _iter_record(loader, number: int) -> dict:
    ctx = getattr(loader, "multiprocessing_context", None)
    try:
        method = ctx.get_start_method() if ctx is not None else multiprocessing.get_start_method()
    except Exception:  # noqa: BLE001 - a context of any kind: the method is unknown
        method = None
    dataset = type(loader.dataset)
    return {"event": "iter", "t": time.time(), "iter": number, "num_workers": loader.num_workers,
            "timeout": loader.timeout, "start_method": method, "batch_size": loader.batch_size,
            "prefetch_factor": loader.prefetch_factor, "pin_memory": loader.pin_memory,
            "dataset": dataset.__module__ + "." + dataset.__qualname__}


def _patch(module, ev: _Evidence) -> None:
    """Record each DataLoader iterator, its batches and the exceptions that escape it."""
    base = module._BaseDataLoaderIter
    original_next, original_init = base.__next__, base.__init__
    original_iter = module.DataLoader.__iter__

    def __iter__(self):
        try:
            return original_iter(self)
        except BaseException as exc:
            ev.loader({"event": "init_error", "t": time.time(), "chain": _chain(exc)})
            raise

    def __init__(self, loader, *a, **kw):
        original_init(self, loader, *a, **kw)
        ev.iterators += 1
        self._lab_iter, self._lab_batches, self._lab_last = ev.iterators, 0, 0.0
        ev.loader(_iter_record(loader, ev.iterators))

    def progress(self):
        self._lab_last = time.time()
        ev.loader({"event": "progress", "t": self._lab_last, "iter": self._lab_iter, "batches": self._lab_batches})

    def __next__(self):
        try:
            data = original_next(self)
        except StopIteration:
            if hasattr(self, "_lab_iter"):
                progress(self)
            raise
        except BaseException as exc:
            ev.loader({"event": "error", "t": time.time(), "chain": _chain(exc)})
            if hasattr(self, "_lab_iter"):
                progress(self)
            raise
        if hasattr(self, "_lab_iter"):
            self._lab_batches += 1
            if time.time() - self._lab_last >= _PROGRESS_EVERY:
                progress(self)
        return data

    module.DataLoader.__iter__ = __iter__
    base.__init__, base.__next__ = __init__, __next__


class _Finder(importlib.abc.MetaPathFinder):
    """Patch ``torch.utils.data.dataloader`` as it is imported (the kernel has not imported torch yet)."""

    def __init__(self, ev: _Evidence):
        self.ev = ev

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch.utils.data.dataloader":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_original = spec.loader.exec_module

        def exec_module(module):
            exec_original(module)
            try:
                _patch(module, self.ev)
            except Exception as exc:  # noqa: BLE001 - a torch this does not fit: said, not fatal
                self.ev.append(_rd.LOADER, {"event": "patch_failed", "error": repr(exc)})

        spec.loader.exec_module = exec_module
        return spec


def install(shell) -> None:
    """Start recording in this kernel (``shell``: its InteractiveShell)."""
    ev = _Evidence()
    if hasattr(signal, "SIGUSR1"):  # the runner's stack dump on a stall: into the run's stderr
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    method = os.environ.get("LABUTILS_KERNEL_START_METHOD")
    if method:
        multiprocessing.set_start_method(method, force=True)
    _record_starts(ev)
    if "torch.utils.data.dataloader" in sys.modules:
        _patch(sys.modules["torch.utils.data.dataloader"], ev)
    else:
        sys.meta_path.insert(0, _Finder(ev))

    def post_run_cell(result):
        err = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        if err is not None:
            with open(os.path.join(ev.folder, _rd.EXC), "w", encoding="utf-8") as fh:
                json.dump(_chain(err), fh, default=repr)
        ev.write_exits()

    shell.events.register("post_run_cell", post_run_cell)
