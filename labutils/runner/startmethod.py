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
import threading
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


def mark_decided() -> None:
    """The run's bootstrap has applied the switch and the run's own choice in this process: a later
    ``import labutils`` here, or in a process forked from here, must not apply the switch again. Kept in
    memory (on the multiprocessing.context module, one per interpreter whoever loads this file), so a
    fork inherits it and an interpreter the run starts (exec, spawn) does not."""
    from multiprocessing import context

    context._labutils_start_decided = True


def decided() -> bool:
    """Whether :func:`mark_decided` ran in this process or in the one it was forked from."""
    return getattr(sys.modules.get("multiprocessing.context"), "_labutils_start_decided", False)


def apply_requested(emulate_preload=None) -> Optional[str]:
    """Apply ``LABUTILS_START_METHOD`` to this process if it is set; return the method applied, or None.
    ``emulate_preload``: where a script is ``__main__`` (the runner's bootstrap), the ``when_imported`` of
    ``runner/child.py``, with which :func:`emulate_fixed_forkserver_preload` waits for the script's own import
    of ``multiprocessing.forkserver``."""
    method = requested()
    if method is not None:
        set_default(method)
        if emulate_preload is not None and method == "forkserver":
            emulate_fixed_forkserver_preload(emulate_preload)
    return method


def forkserver_preloads_main() -> bool:
    """Whether this Python's own fork server imports the main script once, so that its workers do not.

    The server's default preload is ``["__main__"]``, but up to Python 3.13.0 (and on 3.11 and 3.12 for
    good) it looked for a ``main_path`` key that ``spawn.get_preparation_data`` had renamed
    ``init_main_from_path`` in 2013, so every worker ran the script again instead (CPython gh-126631; fixed
    in 3.14 and 3.13's bug-fix releases by PR #135295/#138609). Read from this Python's own source.
    """
    import inspect
    from multiprocessing import forkserver

    try:
        source = inspect.getsource(inspect.unwrap(forkserver.ForkServer.ensure_running))
    except (OSError, TypeError):  # no source to read: assume a current Python
        return True
    return "init_main_from_path" in source


def runs_preload_main() -> bool:
    """Whether the fork server of the lab's isolated runs preloads the main script: this Python's own
    does (:func:`forkserver_preloads_main`), or the lab's forkserver switch is on, under which every run's
    fork server does what 3.14's does (:func:`emulate_fixed_forkserver_preload`)."""
    return forkserver_preloads_main() or requested() == "forkserver"


_EMULATION_LOCK = threading.Lock()  # one patched server start at a time (the patch swaps module functions)


def emulate_fixed_forkserver_preload(when_imported=None) -> bool:
    """Make this process's fork server preload ``__main__`` as Python 3.14's does; True if it had to (or may).

    3.14 sets the server's ``sys.argv`` and ``sys.path`` to the parent's (gh-143706, gh-117378) and
    imports the main script there as ``__mp_main__``, with the bootstrapping check armed, so workers forked
    from the server do not run it again; the server, a fresh interpreter, has forkserver as its default too,
    so a loader that an unguarded top level starts there kills the server, as on 3.14. Here the server's
    command line gets the same steps (its ``main_path`` filled in; argv, path and default start method set
    in front of its command), and nothing else. A Python that does this itself is left alone.

    ``when_imported`` (``runner/child.py``'s): the patch goes on as the script imports the fork server's
    module, not before. Importing it here would import ``multiprocessing.util`` ahead of the script, and the
    exit handler that joins the children a script left would then run after the script's own exit handlers,
    not before them as under python (parity case ``atexit_before_multiprocessing``).
    """
    if when_imported is not None:
        when_imported("multiprocessing.forkserver", lambda module: emulate_fixed_forkserver_preload())
        return True
    import functools
    import types
    from multiprocessing import forkserver, spawn, util

    original = forkserver.ForkServer.ensure_running
    if getattr(original, "_labutils_main_preload", False) or forkserver_preloads_main():
        return False

    @functools.wraps(original)
    def ensure_running(self):
        with _EMULATION_LOCK:
            get_data, spawnv = spawn.get_preparation_data, util.spawnv_passfds
            seen: dict = {}

            def get_preparation_data(name):
                data = get_data(name)
                if "init_main_from_path" in data:
                    data["main_path"] = data["init_main_from_path"]
                seen.update(data)
                return data

            def spawnv_passfds(path, args, passfds):
                args = list(args)
                if len(args) >= 2 and args[-2] == "-c" and "multiprocessing.forkserver import main" in args[-1] \
                        and seen:
                    # the server is a fresh interpreter: on 3.14 its own default start method is forkserver
                    # too (a loader that the script's top level starts there trips the bootstrapping check)
                    setup = ("import sys; import multiprocessing.context as _c; "
                             "_c._default_context._default_context = _c._concrete_contexts['forkserver']; del _c; ")
                    if "sys_argv" in seen:
                        setup += f"sys.argv[:] = {list(seen['sys_argv'])!r}; "
                    if "sys_path" in seen:
                        setup += f"sys.path[:] = {list(seen['sys_path'])!r}; "
                    args[-1] = setup + args[-1]
                return spawnv(path, args, passfds)

            spawn.get_preparation_data, util.spawnv_passfds = get_preparation_data, spawnv_passfds
            try:
                return original(self)
            finally:
                spawn.get_preparation_data, util.spawnv_passfds = get_data, spawnv

    ensure_running._labutils_main_preload = True
    forkserver.ForkServer.ensure_running = ensure_running
    forkserver.ensure_running = types.MethodType(ensure_running, forkserver._forkserver)
    return True


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
