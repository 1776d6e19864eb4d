"""Loaded by path in the notebook's kernel as its first cell (not the learner's), by
:mod:`labutils.runner.notebook_runner`: the evidence the bootstrap records for a script, for a notebook.

DataLoader iterators, their progress and the exceptions that escape them go to the run's own
``loader.jsonl`` (so the runner sees progress and stalls in the kernel as in a script); the processes the
kernel starts, their exit codes and a failing cell's exception go under the run directory's ``kernel/``
folder (``LABUTILS_KERNEL_EVIDENCE``). It imports only the standard library: labutils may not be
importable in the kernel, and importing it would cost every notebook its start-up.
"""

import faulthandler
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
#: labutils/runner/child.py: the DataLoader iterators' records, as the bootstrap makes them for a script
_child = runpy.run_path(os.path.join(_HERE, "child.py"))


class _Evidence:
    """Where the kernel's records go, and the processes it started."""

    def __init__(self):
        self.folder = os.environ["LABUTILS_KERNEL_EVIDENCE"]
        self.run_dir = os.environ["LABUTILS_RUN_DIR"]
        self.main_pid = os.getpid()
        self.started: list = []

    def append(self, name: str, record: dict, folder=None) -> None:
        _child["append"](folder or self.folder, name, record)

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


def install(shell) -> None:
    """Start recording in this kernel (``shell``: its InteractiveShell)."""
    ev = _Evidence()
    if hasattr(signal, "SIGUSR1"):  # the runner's stack dump on a stall: into the run's stderr
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    method = os.environ.get("LABUTILS_KERNEL_START_METHOD")
    if method:
        multiprocessing.set_start_method(method, force=True)
    _record_starts(ev)

    def patch(module):
        try:
            _child["watch_loaders"](module, ev.loader, _chain, ev.main_pid)
        except Exception as exc:  # noqa: BLE001 - a torch this does not fit: said, not fatal
            ev.append(_rd.LOADER, {"event": "patch_failed", "error": repr(exc)})

    _child["when_imported"]("torch.utils.data.dataloader", patch)

    def post_run_cell(result):
        err = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        if err is not None:
            with open(os.path.join(ev.folder, _rd.EXC), "w", encoding="utf-8") as fh:
                json.dump(_chain(err), fh, default=repr)
        ev.write_exits()

    shell.events.register("post_run_cell", post_run_cell)
