"""Find the inputs that crash native code, by running the crashing code itself in throwaway processes.

A check with another library cannot stand in for the decoder that crashes: it may reject files the
decoder reads fine, and accept files that kill it. :func:`find_crashing_inputs` feeds the inputs, in
order, to the real function in a child process. When the child dies (a signal, an exit code, or no
progress within ``item_timeout``), the input it was working on is recorded and a new child carries on with
the next one. It costs one process per crash, plus one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ..runner.result import signal_name

_CHILD = r"""
import importlib, json, sys
module, _, name = sys.argv[1].partition(":")
func = importlib.import_module(module)
for part in name.split("."):
    func = getattr(func, part)
with open(sys.argv[2], encoding="utf-8") as fh:
    items = json.load(fh)
for i in range(int(sys.argv[3]), len(items)):
    print("start", i, flush=True)
    func(items[i])
    print("done", i, flush=True)
"""


@dataclass
class Crash:
    """One input that ended its process: ``how`` is e.g. ``"SIGSEGV"``, ``"exit code 3"`` or ``"hang"``."""

    index: int
    item: Any
    how: str
    stderr_tail: str = ""


def _how(returncode: Optional[int]) -> str:
    if returncode is None:
        return "hang"
    if returncode < 0:
        return signal_name(-returncode)
    return f"exit code {returncode}"


def find_crashing_inputs(target: str, items: Sequence[Any], *, item_timeout: float = 30.0,
                         env: Optional[dict] = None, cwd: Optional[str] = None,
                         python: Optional[str] = None) -> list:
    """Return a :class:`Crash` for every item on which ``target`` (``"module:function"``) kills its process.

    ``items`` must be JSON values (paths as strings, numbers). ``env`` is added to the child's environment
    (for example ``PYTHONPATH`` to find the module). A Python exception from ``target`` counts as a crash
    too ("exit code 1"): this is a search for inputs that end the process, and the stderr tail says which.
    """
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"target={target!r}: give 'module:function', e.g. 'decoder:decode'")
    items = list(items)
    try:
        payload = json.dumps(items)
    except TypeError as exc:
        raise ValueError(f"items must be JSON values (strings, numbers): {exc}") from None
    child_env = dict(os.environ)
    child_env.update({str(k): str(v) for k, v in (env or {}).items()})
    crashes: list = []
    with tempfile.TemporaryDirectory(prefix="labutils-triage-") as tmp:
        items_file = os.path.join(tmp, "items.json")
        with open(items_file, "w", encoding="utf-8") as fh:
            fh.write(payload)
        start = 0
        while start < len(items):
            current, returncode, err = _run_child(python or sys.executable, target, items_file, start,
                                                  item_timeout, child_env, cwd, tmp)
            if returncode == 0:
                break
            if current is None:  # it died outside any item: at import, or at exit
                raise RuntimeError(f"{target} ended ({_how(returncode)}) outside any item; its stderr:\n"
                                   f"{err[-2000:]}")
            crashes.append(Crash(current, items[current], _how(returncode), err[-2000:]))
            start = current + 1
    return crashes


def _run_child(python, target, items_file, start, item_timeout, env, cwd, tmp):
    err_path = os.path.join(tmp, f"stderr-{start}.txt")
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([python, "-c", _CHILD, target, items_file, str(start)], stdout=subprocess.PIPE,
                                stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
    current = None
    last = time.monotonic()
    returncode: Optional[int] = None
    try:
        os.set_blocking(proc.stdout.fileno(), False)
        buffer = b""
        while True:
            chunk = b""
            try:
                chunk = proc.stdout.read() or b""
            except BlockingIOError:
                pass
            if chunk:
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    word, _, index = line.decode().partition(" ")
                    current = int(index) if word == "start" else None
                    last = time.monotonic()
            if proc.poll() is not None and not chunk:
                returncode = proc.returncode
                break
            if current is not None and time.monotonic() - last > item_timeout:
                break  # no progress on one item: a hang counts as a crash of that item
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the group of our own child, before it is reaped
        proc.wait()
        proc.stdout.close()
    with open(err_path, encoding="utf-8", errors="replace") as fh:
        return current, returncode, fh.read()
