"""The lab's start-method switch: try the whole tutorial as Python 3.14 (forkserver) or macOS (spawn) sees it.

Python picks a default start method per platform: ``fork`` on Linux up to 3.13, ``forkserver`` on Linux
from 3.14, ``spawn`` on macOS and Windows. A DataLoader with no ``multiprocessing_context`` uses that
default. Set ``LABUTILS_START_METHOD`` (``fork``, ``forkserver`` or ``spawn``) before you start Jupyter or
``pytest`` (or pass ``pytest --lab-start-method forkserver``), and the lab changes the *default* in the
kernel (when ``labutils`` is imported) and in every isolated run, exactly the way a newer Python changes
it: the default moves, but nothing is "set", so a script may still call
``multiprocessing.set_start_method(...)`` itself, and an explicit ``multiprocessing_context`` or
``start_method=`` still wins.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

ENV = "LABUTILS_START_METHOD"
METHODS = ("fork", "forkserver", "spawn")


def requested() -> Optional[str]:
    """The start method asked for through ``LABUTILS_START_METHOD``, or None; a bad value is a clear error."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    if value not in METHODS:
        raise ValueError(f"{ENV}={value!r}: use one of {', '.join(METHODS)} (or unset it for Python's default)")
    if value != "spawn" and sys.platform == "win32":
        raise ValueError(f"{ENV}={value!r}: only spawn exists on Windows; run the lab under WSL")
    return value


def set_default(method: str) -> None:
    """Make ``method`` multiprocessing's default without fixing it, as a newer Python's default would be.

    ``multiprocessing.set_start_method`` would also work, but it marks the context as set, and a script that
    then calls ``set_start_method`` itself fails with "context has already been set". Where the private
    attribute this uses is missing (another Python implementation), it falls back to
    ``set_start_method(method, force=True)``.
    """
    if method not in METHODS:
        raise ValueError(f"start method {method!r}: use one of {', '.join(METHODS)}")
    import multiprocessing
    from multiprocessing import context

    default = getattr(context, "_default_context", None)
    concrete = getattr(context, "_concrete_contexts", {}).get(method)
    if default is None or concrete is None or not hasattr(default, "_default_context"):
        multiprocessing.set_start_method(method, force=True)
        return
    # Only the default moves: where a start method was already chosen (set_start_method, or an explicit
    # start_method= for the run), that choice stands, as it would on a newer Python.
    default._default_context = concrete


def apply_requested() -> Optional[str]:
    """Apply ``LABUTILS_START_METHOD`` to this process if it is set; return the method applied, or None."""
    method = requested()
    if method is not None:
        set_default(method)
    return method


def python_default() -> str:
    """The start method this Python picks on this platform when nobody asks for one."""
    if sys.platform == "win32" or sys.platform == "darwin":
        return "spawn"
    return "forkserver" if sys.version_info >= (3, 14) else "fork"


def current() -> str:
    """The start method a DataLoader without ``multiprocessing_context`` would use in this process now."""
    import multiprocessing

    method = multiprocessing.get_start_method(allow_none=True)
    if method:
        return method
    from multiprocessing import context

    default = getattr(context, "_default_context", None)
    inner = getattr(default, "_default_context", None)
    return getattr(inner, "_name", None) or python_default()
