"""Small hooks that run inside every process of an isolated run (the main process and its workers).

The runner puts a copy of this file in the run directory (on ``sys.path``, as ``_labutils_child``), so
that spawn and forkserver workers can unpickle a reference to :func:`run` without importing the
``labutils`` package (which would cost them its import time). It imports only the standard library. The
notebook kernel's preamble loads it by path too, for :func:`watch_loaders`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

_stack_file = None  # kept open for faulthandler for the life of the process
_stack_pid = None


def append(run_dir: str, name: str, record: dict) -> None:
    """One JSON line in one write (``O_APPEND``: whole lines, whoever else writes); nothing where the run
    directory is gone (a straggler writing late) or the write fails."""
    try:
        fd = os.open(os.path.join(run_dir, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        return
    try:
        os.write(fd, (json.dumps(record, default=repr) + "\n").encode("utf-8"))
    except OSError:
        pass
    finally:
        os.close(fd)


def register_stacks(run_dir: str) -> None:
    """Dump this process's Python stack (all threads) to ``RUN_DIR/stacks/<pid>.txt`` on SIGUSR1 (the file
    tells the runner that the signal is safe to send: without the handler it would kill the process)."""
    global _stack_file, _stack_pid
    if not hasattr(signal, "SIGUSR1") or _stack_pid == os.getpid():
        return
    import faulthandler

    folder = os.path.join(run_dir, "stacks")
    try:
        os.makedirs(folder, exist_ok=True)
        fh = open(os.path.join(folder, f"{os.getpid()}.txt"), "w", encoding="utf-8")  # noqa: SIM115
    except OSError:
        return
    faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True)
    old, _stack_file, _stack_pid = _stack_file, fh, os.getpid()
    if old is not None:  # a forked child: the parent's file object, not ours to write to any more
        try:
            old.close()
        except OSError:
            pass


def when_imported(name: str, patch) -> None:
    """Call ``patch(module)`` once module ``name`` is imported: now if it is already, else right after the
    import that brings it in (a meta path finder that steps aside after that one import). The bootstrap
    imports nothing on the learner's behalf this way: ``multiprocessing.util`` registers its exit handler
    when it is imported, and where it stands among the script's own handlers decides their order at exit."""
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
        return
    sys.meta_path.insert(0, _AfterImport(name, patch))


class _AfterImport:
    """The meta path finder of :func:`when_imported` (the import machinery's own PathFinder finds the spec)."""

    def __init__(self, name: str, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original_exec, patch = spec.loader.exec_module, self.patch

        def exec_module(module):
            original_exec(module)
            try:
                patch(module)
            except Exception:  # noqa: BLE001, S110 - evidence is best effort: never break the import
                pass

        spec.loader.exec_module = exec_module
        return spec


PROGRESS_EVERY = 0.25  # seconds between two progress records of one iterator


def watch_loaders(module, record, chain, main_pid: int) -> None:
    """Wrap the iterators of ``module`` (``torch.utils.data.dataloader``) so that the process ``main_pid``
    records each one's creation (``iter``), its progress (batches delivered: at most about four records a
    second, plus a last one) and every exception that escapes ``iter(loader)`` (``init_error``) or
    ``next()`` (``error``), even one the script catches: ``record(dict)`` takes each record, ``chain(exc)``
    gives an exception's chain as records."""
    base = module._BaseDataLoaderIter
    original_next, original_init = base.__next__, base.__init__
    original_iter = module.DataLoader.__iter__
    counter = [0]

    def __iter__(self):
        try:
            return original_iter(self)
        except BaseException as exc:
            if os.getpid() == main_pid:
                record({"event": "init_error", "t": time.time(), "chain": chain(exc)})
            raise

    def __init__(self, loader, *a, **kw):
        original_init(self, loader, *a, **kw)
        if os.getpid() != main_pid:
            return
        counter[0] += 1
        self._labutils_iter, self._labutils_batches, self._labutils_last = counter[0], 0, 0.0
        record(_iter_record(loader, counter[0]))

    def progress(self, now: float) -> None:
        self._labutils_last = now
        record({"event": "progress", "t": now, "batches": self._labutils_batches, "iter": self._labutils_iter})

    def __next__(self):
        watched = getattr(self, "_labutils_iter", None) is not None
        try:
            data = original_next(self)
        except StopIteration:
            if watched:
                progress(self, time.time())
            raise
        except BaseException as exc:
            if os.getpid() == main_pid:
                record({"event": "error", "t": time.time(), "chain": chain(exc)})
                if watched:
                    progress(self, time.time())
            raise
        if watched:
            self._labutils_batches += 1
            now = time.time()
            if now - self._labutils_last >= PROGRESS_EVERY:
                progress(self, now)
        return data

    base.__init__, base.__next__ = __init__, __next__
    module.DataLoader.__iter__ = __iter__


def _iter_record(loader, number: int) -> dict:
    """The ``iter`` record of a new iterator: the loader's settings, start method and sharing strategy."""
    ctx = getattr(loader, "multiprocessing_context", None)
    try:
        import torch.multiprocessing as tmp

        strategy = tmp.get_sharing_strategy()
        method = ctx.get_start_method() if ctx is not None else tmp.get_start_method()
    except Exception:  # noqa: BLE001 - evidence is best effort
        strategy = method = None
    dataset = type(loader.dataset)
    return {"event": "iter", "t": time.time(), "iter": number, "num_workers": loader.num_workers,
            "timeout": loader.timeout, "start_method": method, "sharing_strategy": strategy,
            "pin_memory": loader.pin_memory, "persistent_workers": loader.persistent_workers,
            "prefetch_factor": loader.prefetch_factor, "batch_size": loader.batch_size,
            "dataset": dataset.__module__ + "." + dataset.__qualname__}


def record_semaphores(run_dir: str) -> None:
    """Record the name and inode of every named semaphore created by this process (and forked children),
    so that the runner removes only files its run created."""
    when_imported("multiprocessing.synchronize", lambda module: _record_semaphores(run_dir, module))


def _record_semaphores(run_dir: str, synchronize) -> None:
    cls = getattr(synchronize, "SemLock", None)
    if cls is None or getattr(cls.__init__, "_labutils_wrapped", False):
        return
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        name = getattr(getattr(self, "_semlock", None), "name", None)
        if name:
            entry = "sem." + name.lstrip("/")
            try:
                ino = os.stat(os.path.join("/dev/shm", entry)).st_ino
            except OSError:
                ino = None
            append(run_dir, "created_shm.jsonl", {"name": entry, "ino": ino, "pid": os.getpid(),
                                                   "t": time.time()})

    __init__._labutils_wrapped = True
    cls.__init__ = __init__


def record_temp_dirs(run_dir: str) -> None:
    """Record multiprocessing's temporary folder (``/tmp/pymp-*``) when this process makes one.

    multiprocessing removes that folder when the process exits normally; a process killed by the OOM
    killer or by the run's time limit never does, so the runner removes it, and only a recorded one with
    the same inode.
    """
    when_imported("multiprocessing.util", lambda module: _record_temp_dirs(run_dir, module))


def _record_temp_dirs(run_dir: str, util) -> None:
    from multiprocessing import process

    original = util.get_temp_dir
    if getattr(original, "_labutils_wrapped", False):
        return

    def get_temp_dir():
        had = process.current_process()._config.get("tempdir")
        path = original()
        if path != had:  # made just now, by this process
            try:
                ino = os.stat(path).st_ino
            except OSError:
                ino = None
            append(run_dir, "created_tmp.jsonl", {"path": path, "ino": ino, "pid": os.getpid(), "t": time.time()})
        return path

    get_temp_dir._labutils_wrapped = True
    util.get_temp_dir = get_temp_dir


def run(run_dir: str, target, *args, **kwargs):
    """Run a DataLoader worker's real ``target`` after registering this process's hooks."""
    register_stacks(run_dir)
    record_semaphores(run_dir)
    record_temp_dirs(run_dir)
    return target(*args, **kwargs)
