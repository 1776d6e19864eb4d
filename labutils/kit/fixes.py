"""Reusable fixes for DataLoader worker failures, each the correct version of a common "production" trick:
handles opened lazily in the process that uses them (:class:`PerWorkerResource`, :class:`LazyFile`), the
quarantine of bad samples (:mod:`labutils.kit.quarantine`, importable from here too), a ``worker_init_fn``
that seeds and makes a dying or stuck worker print its Python stack (:func:`make_worker_init`), and a loader
that rebuilds itself after a worker's death (:class:`ResilientLoader`). Torch is imported only when used.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import random
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from ..diagnosis.evidence import is_worker_death  # the lab's one detector, which the diagnosis uses too
from .quarantine import QuarantineDataset, QuarantinedBatch, QuarantineReport, Skipped, collate_skip

__all__ = [
    "LazyFile",
    "PerWorkerResource",
    "Skipped",
    "QuarantinedBatch",
    "QuarantineDataset",
    "collate_skip",
    "QuarantineReport",
    "worker_init_seed_and_faulthandler",
    "make_worker_init",
    "WorkerInit",
    "pet_watchdog",
    "is_worker_death",
    "ResilientLoader",
    "RestartEvent",
]

log = logging.getLogger(__name__)

# Handles inherited from a parent through fork. They are kept referenced and never closed or flushed in
# the child: closing would flush a parent's write buffer twice, and the shared file offset belongs to the
# parent. Forked DataLoader workers leave through os._exit, so nothing is finalised at exit either.
_INHERITED: list = []


class PerWorkerResource:
    """A resource built lazily, once per process, from a picklable ``factory`` (released by ``close``, else
    by its own ``close()`` method).

    Pickling sends only the factory (a module-level function, a class or a ``functools.partial`` of one;
    not a lambda). :meth:`get` builds the resource on first use in each process, and again after a fork,
    so forked workers never share the parent's connection::

        db = PerWorkerResource(functools.partial(sqlite3.connect, "data.db"))
        db.get().execute("SELECT ...")   # in __getitem__, inside each worker
    """

    def __init__(self, factory: Callable[[], Any], close: Optional[Callable[[Any], Any]] = None) -> None:
        if not callable(factory):
            raise TypeError(f"factory must be callable, got {type(factory).__name__}")
        self.factory = factory
        self.closer = close
        self._resource: Any = None
        self._pid: Optional[int] = None

    @property
    def opened_pid(self) -> Optional[int]:
        """The pid of the process that built the current resource (None before first use)."""
        return self._pid

    def get(self) -> Any:
        """The resource for this process, built now if this process has none yet."""
        pid = os.getpid()
        if self._pid != pid:
            if self._pid is not None and self._resource is not None:
                _INHERITED.append(self._resource)  # the parent's: leave it alone
            self._resource = self.factory()
            self._pid = pid
        return self._resource

    __call__ = get

    def close(self) -> None:
        """Release the resource if this process built it (an inherited one is left to its owner)."""
        resource, pid = self._resource, self._pid
        self._resource, self._pid = None, None
        if resource is None or pid != os.getpid():
            return
        if self.closer is not None:
            self.closer(resource)
        elif hasattr(resource, "close"):
            resource.close()

    def __getstate__(self) -> dict:
        return {"factory": self.factory, "closer": self.closer}

    def __setstate__(self, state: dict) -> None:
        self.factory = state["factory"]
        self.closer = state["closer"]
        self._resource, self._pid = None, None

    def __repr__(self) -> str:
        state = f"open in pid {self._pid}" if self._pid is not None else "not opened"
        return f"{type(self).__name__}({self.factory!r}, {state})"


class _OpenFile:
    """Picklable factory for :class:`LazyFile` (a module-level class, so spawn can import it)."""

    def __init__(self, path: str, mode: str, kwargs: dict) -> None:
        self.path, self.mode, self.kwargs = path, mode, kwargs

    def __call__(self) -> Any:
        return open(self.path, self.mode, **self.kwargs)

    def __repr__(self) -> str:
        return f"open({self.path!r}, {self.mode!r})"


class LazyFile(PerWorkerResource):
    """A file that pickles as ``(path, mode)`` and is opened on first use in the process that uses it.

    Use it like a file (``read``, ``seek``, ``readline``, iteration): attribute access opens it. After a
    fork the child opens its own handle, so workers do not move each other's file offset, and under
    spawn/forkserver the dataset pickles (an open file does not).
    """

    def __init__(self, path: str | os.PathLike, mode: str = "rb", **open_kwargs: Any) -> None:
        if "w" in mode or "a" in mode or "x" in mode or "+" in mode:
            raise ValueError(
                f"LazyFile is for reading (mode {mode!r} would reopen and write from several processes); "
                "write from one process, or give each worker its own file"
            )
        super().__init__(_OpenFile(os.fspath(path), mode, open_kwargs))

    @property
    def path(self) -> str:
        return self.factory.path

    @property
    def mode(self) -> str:
        return self.factory.mode

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("factory", "closer"):
            raise AttributeError(name)
        return getattr(self.get(), name)

    def __iter__(self) -> Iterator:
        return iter(self.get())

    def __enter__(self) -> LazyFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def worker_init_seed_and_faulthandler(worker_id: int) -> None:
    """A ``worker_init_fn``: seed ``random`` and numpy from ``torch.initial_seed()``, enable faulthandler.

    In a worker, ``torch.initial_seed()`` is already ``base_seed + worker_id``, different per worker and
    per epoch. PyTorch seeds ``random``, torch and numpy's *global* RNG itself; this makes it explicit
    and does not help other generators (a ``np.random.default_rng()`` made in ``__init__`` is copied into
    every worker: re-create it here from ``torch.utils.data.get_worker_info().seed``).

    ``faulthandler`` then prints the worker's Python stack to its stderr when it dies of SIGSEGV, SIGFPE,
    SIGABRT, SIGBUS or SIGILL, so "killed by signal: Segmentation fault" comes with the line of
    ``__getitem__`` that crashed. PyTorch's own handler still runs after it and the exit status is kept.
    """
    import torch

    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)
    faulthandler.enable(file=_stderr_fd(), all_threads=True)


def _stderr_fd() -> int:
    """The worker's stderr as a descriptor: faulthandler writes from a signal handler, so it needs a real
    fd (a notebook's or pytest's ``sys.stderr`` replacement may have none; fd 2 is what they forward)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):
        return 2


_WATCHDOG_S: Optional[float] = None


class WorkerInit:
    """Picklable ``worker_init_fn`` made by :func:`make_worker_init` (a module-level class, not a closure,
    so it works with spawn and forkserver)."""

    def __init__(self, dump_after: Optional[float] = None, then: Optional[Callable[[int], Any]] = None) -> None:
        if dump_after is not None and dump_after <= 0:
            raise ValueError(f"dump_after must be a positive number of seconds, not {dump_after}")
        self.dump_after = dump_after
        self.then = then

    def __call__(self, worker_id: int) -> None:
        global _WATCHDOG_S
        worker_init_seed_and_faulthandler(worker_id)
        if self.dump_after is not None:
            _WATCHDOG_S = self.dump_after
            faulthandler.dump_traceback_later(self.dump_after, repeat=True, file=_stderr_fd())
        if self.then is not None:
            self.then(worker_id)

    def __repr__(self) -> str:
        return f"WorkerInit(dump_after={self.dump_after!r}, then={self.then!r})"


def make_worker_init(dump_after: Optional[float] = None, then: Optional[Callable[[int], Any]] = None) -> WorkerInit:
    """Return a picklable ``worker_init_fn``: :func:`worker_init_seed_and_faulthandler`, and optionally
    a watchdog and a user ``then(worker_id)`` callable.

    With ``dump_after`` (seconds), each worker arms ``faulthandler.dump_traceback_later(dump_after,
    repeat=True)``: every ``dump_after`` seconds it prints its stack to stderr, which shows where a stuck
    worker is (look for your ``__getitem__`` frame). It fires whether or not the worker is stuck, idle
    workers included; call :func:`pet_watchdog` at the start of ``__getitem__`` to push it back while the
    worker makes progress, and pick a value well above a normal item's time.
    """
    return WorkerInit(dump_after, then)


def pet_watchdog() -> None:
    """Restart the dump timer armed by :func:`make_worker_init` (no-op when none is armed here)."""
    if _WATCHDOG_S is not None:
        faulthandler.dump_traceback_later(_WATCHDOG_S, repeat=True, file=_stderr_fd())


@dataclass
class RestartEvent:
    """One recovery of :class:`ResilientLoader`."""

    epoch: int
    batch_index: int  # the first batch not yet delivered, where the new loader resumed
    error: str
    num_workers: int  # of the new loader


def _shut_down(iterator: Any) -> Optional[BaseException]:
    """Stops ``iterator``'s workers (best effort: they may be gone already); returns what the shut-down raised,
    which can be PyTorch's SIGCHLD report of a worker's death arriving before the shut-down unregistered it."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is None:
        return None
    try:
        shutdown()
    except Exception as exc:  # noqa: BLE001 - kept for the caller to judge
        return exc
    return None


class ResilientLoader:
    """Iterate a map-style dataset like a DataLoader; when a worker dies, rebuild and resume.

    At the start of each epoch the batch sampler is drawn once into a fixed list of index batches (so a
    shuffled epoch keeps its order across a restart). Batches are yielded in order; when a worker death
    surfaces (see :func:`is_worker_death`), the loader is rebuilt with ``fallback_num_workers`` (or the
    same ``num_workers``) and resumes at the first batch that was not delivered. So every batch of the
    epoch is yielded exactly once, unless ``max_restarts`` is exceeded, and then the original error is
    raised. Batches that were in flight in the dead worker are loaded again: a ``__getitem__`` with side
    effects may see an index twice, the training loop does not. Exceptions raised by ``__getitem__`` or
    collate are not deaths and propagate unchanged on the first occurrence.

    Best effort: PyTorch's SIGCHLD handler raises wherever the main thread is. While it waits for a batch
    (almost always) that is inside this iterator and is recovered; in your loop body it reaches you.

    ``dataset`` must be map-style (resumed by index); ``max_restarts`` is per epoch; rebuilt loaders use
    ``fallback_num_workers`` (None: the same; 0 loads in the main process, where a sample that kills its
    process kills the main one); ``on_restart`` gets each :class:`RestartEvent` (default: a log warning);
    ``loader_kwargs`` are DataLoader's (``in_order=False`` is refused). ``restarts`` and ``events`` count
    the recoveries over the object's life.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        max_restarts: int = 2,
        fallback_num_workers: Optional[int] = None,
        on_restart: Optional[Callable[[RestartEvent], Any]] = None,
        **loader_kwargs: Any,
    ) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, not {max_restarts}")
        if loader_kwargs.get("in_order", True) is False:
            raise ValueError("ResilientLoader needs in_order=True: it resumes after the last delivered batch")
        from torch.utils.data import IterableDataset

        if isinstance(dataset, IterableDataset):
            raise TypeError("ResilientLoader resumes by index: it needs a map-style dataset, not an "
                            "IterableDataset")
        self.dataset = dataset
        self.max_restarts = max_restarts
        self.fallback_num_workers = fallback_num_workers
        self.on_restart = on_restart
        self.loader_kwargs = dict(loader_kwargs)
        self.restarts = 0
        self.events: list = []
        self.epoch = 0

    _SAMPLING_KEYS = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "generator")

    def _probe(self) -> Any:
        """A loader with no workers and the sampling arguments only: what the samplers draw."""
        from torch.utils.data import DataLoader

        sampling = {k: v for k, v in self.loader_kwargs.items() if k in self._SAMPLING_KEYS}
        return DataLoader(self.dataset, num_workers=0, **sampling)

    def _epoch_batches(self) -> tuple:
        """(list of index batches or indices, auto_collation) for one epoch, drawn from the samplers."""
        probe = self._probe()
        if probe.batch_sampler is not None:
            return [list(b) for b in probe.batch_sampler], True
        return list(probe.sampler), False

    def _loader(self, rest: list, auto_collation: bool, num_workers: int) -> Any:
        from torch.utils.data import DataLoader

        kwargs = {k: v for k, v in self.loader_kwargs.items() if k not in self._SAMPLING_KEYS}
        kwargs["num_workers"] = num_workers
        if num_workers == 0:
            for key in ("prefetch_factor", "persistent_workers", "multiprocessing_context", "timeout"):
                kwargs.pop(key, None)
        if auto_collation:
            return DataLoader(self.dataset, batch_sampler=rest, **kwargs)
        return DataLoader(self.dataset, batch_size=None, sampler=rest, **kwargs)

    def __len__(self) -> int:
        return len(self._probe())

    def __iter__(self) -> Iterator:
        batches, auto = self._epoch_batches()
        epoch, self.epoch = self.epoch, self.epoch + 1
        num_workers = int(self.loader_kwargs.get("num_workers", 0))
        delivered = 0
        restarts_this_epoch = 0
        while True:
            iterator = iter(self._loader(batches[delivered:], auto, num_workers))
            late = None
            try:
                try:
                    for batch in iterator:
                        delivered += 1
                        yield batch
                    return
                finally:
                    late = _shut_down(iterator)
                    del iterator
            except Exception as exc:  # judged after the shut-down, once PyTorch's SIGCHLD handler is quiet
                failure = late if late is not None and is_worker_death(late) else exc  # a death's own report
                if not is_worker_death(failure) or restarts_this_epoch >= self.max_restarts:
                    if failure is exc:
                        raise
                    raise failure from exc  # the death's report, after the echo the loop met
            restarts_this_epoch += 1
            self.restarts += 1
            if self.fallback_num_workers is not None:
                num_workers = self.fallback_num_workers
            event = RestartEvent(epoch, delivered, f"{type(failure).__name__}: {failure}", num_workers)
            self.events.append(event)
            if self.on_restart is not None:
                self.on_restart(event)
            else:
                log.warning("DataLoader worker died at batch %d of epoch %d (%s); restarting with "
                            "num_workers=%d", delivered, epoch, event.error, num_workers)
