"""Find what stops an object from being pickled for spawn/forkserver DataLoader workers.

With ``spawn`` and ``forkserver``, ``DataLoader`` pickles the dataset, ``collate_fn`` and ``worker_init_fn``
into every worker (``ForkingPickler``); one unpicklable attribute deep inside (an open file, a connection, a
lock, a lambda) fails the start with ``TypeError: cannot pickle '...' object`` and no path.
:func:`find_unpicklable` names every such path. Kept fast on big datasets: the whole object is pickled once,
and only what fails is descended into, the way pickle would; big sequences are bisected.
"""

from __future__ import annotations

import copyreg
import functools
import pickle
import socket
import sys
import types
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Optional

from ..machine.probes import main_importable

__all__ = ["Blocker", "BlockerList", "find_unpicklable", "format_blockers"]

# Protocol 5 with a buffer_callback lets numpy arrays and other PickleBuffer users go out of band, so a
# probe does not copy gigabytes of array data. It judges the same objects as the default protocol.
_PROTOCOL = 5
_LEAF_RUN = 8  # sequences this short are checked item by item instead of bisected
_MAX_DEPTH = 100
_ATOMIC = (int, float, complex, str, bytes, bool, type(None))

_MAIN_REASON = "defined in __main__; spawn/forkserver workers cannot import it from a notebook or `python -c`"


@dataclass(frozen=True)
class Blocker:
    """One attribute path that stops pickling (``dataset.cache._lock``), the offending type (for functions and
    classes their qualified name, ``make.<locals>.collate``: what has to move), the pickle error (or why a
    ``__main__`` reference fails in a worker) and what usually fixes it."""

    path: str
    type_name: str
    reason: str
    hint: str = ""

    def __str__(self) -> str:
        return f"{self.path} -> {self.type_name}: {self.reason}"


class BlockerList(list):
    """A list of :class:`Blocker`; ``more``: blockers beyond ``max_items``; ``truncated``: the search
    stopped at its pickle-call budget."""

    more: int = 0
    truncated: bool = False
    checks: int = 0

    def __str__(self) -> str:
        return format_blockers(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython display
        p.text(format_blockers(self))


# =========================================================================== probe
def _placeholder() -> None:
    """Stands in for objects the real ForkingPickler would share (tensors, sockets) without side effects."""


def _safe_tensor_reduce(tensor: Any) -> tuple:
    # torch.multiprocessing.reductions.reduce_tensor moves the storage into shared memory, a side effect a
    # probe must not have. Keep only its failure condition.
    if getattr(tensor, "requires_grad", False) and not getattr(tensor, "is_leaf", True):
        raise RuntimeError("Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does "
                           "not support crossing process boundaries. Call detach() on the tensor.")
    return (_placeholder, ())


def _safe_reduce(obj: Any) -> tuple:
    return (_placeholder, ())


def _dispatch_table() -> dict:
    """ForkingPickler's reducers, with the side-effecting ones (shm moves, fd duplication) neutralised."""
    table = dict(copyreg.dispatch_table)
    extra = dict(getattr(ForkingPickler, "_extra_reducers", {}))
    for cls, reducer in extra.items():
        module = getattr(reducer, "__module__", "") or ""
        name = getattr(reducer, "__name__", "")
        if module.startswith("torch"):
            extra[cls] = _safe_tensor_reduce if name == "reduce_tensor" else _safe_reduce
        elif name in ("_reduce_socket", "reduce_connection", "reduce_pipe_connection"):
            extra[cls] = _safe_reduce
    extra.setdefault(socket.socket, _safe_reduce)
    table.update(extra)
    return table


_SINK = types.SimpleNamespace(write=len)  # a file that drops what is written: a probe needs the verdict


# ForkingPickler is a pickle.Pickler whose dispatch_table is copyreg's plus its registered reducers;
# these probes are the same with _dispatch_table(), and also accept buffer_callback.
class _Pickler(pickle.Pickler):
    main_refs: list


class _MainWatchingPickler(_Pickler):
    """Also records classes and functions pickled by reference to ``__main__``."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            self.main_refs.append(obj)
        return NotImplemented


@dataclass
class _Verdict:
    error: Optional[BaseException]
    main_refs: list


def _pickle_check(obj: Any, table: dict, watch_main: bool) -> Optional[_Verdict]:
    """Pickle ``obj`` into a sink; return None if it pickles (and references nothing in an unimportable
    ``__main__``), else the error and the ``__main__`` references. Every probe goes through here."""
    cls = _MainWatchingPickler if watch_main else _Pickler
    pickler = cls(_SINK, _PROTOCOL, buffer_callback=lambda buf: False)  # out of band: not copied
    pickler.dispatch_table = table
    pickler.main_refs = []
    error: Optional[BaseException] = None
    try:
        pickler.dump(obj)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the verdict
        error = exc
    if error is None and not pickler.main_refs:
        return None
    return _Verdict(error, pickler.main_refs)


# =========================================================================== naming
def _qualified(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or "?"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    return name if module == "builtins" else f"{module}.{name}"


def _type_name(obj: Any) -> str:
    return _qualified(obj if isinstance(obj, (type, types.FunctionType)) else type(obj))


def _key_text(key: Any) -> Optional[str]:
    text = repr(key) if isinstance(key, _ATOMIC) else ""
    return text if 0 < len(text) <= 60 else None


def _hint(obj: Any, main: bool) -> str:
    if main:
        return "move the class or function into a .py module and import it from there"
    if isinstance(obj, types.FunctionType):
        return "define it at module level (functools.partial of a module-level function for parameters)"
    if isinstance(obj, type):
        return "define the class at module level in an importable module"
    name = _type_name(obj)
    if name.startswith("torch.") and "Tensor" in name or name == "torch.nn.parameter.Parameter":
        return "store tensor.detach(): an autograd graph cannot cross process boundaries"
    if any(word in name.lower() for word in ("lock", "rlock", "condition", "semaphore", "event")):
        return "drop it in __getstate__ and recreate it in __setstate__, or create it lazily in the worker"
    if any(word in name.lower() for word in ("io.", "connection", "cursor", "socket", "file", "env")):
        return "open it lazily in each worker (labutils.kit.fixes.LazyFile / PerWorkerResource)"
    if name in ("generator", "coroutine"):
        return "store what creates the generator (a list, a path, a callable), not the generator"
    return "exclude it in __getstate__ or create it lazily in each worker"


# =========================================================================== search
class _Search:
    def __init__(self, check_main: bool, max_items: int, max_checks: int) -> None:
        self.watch_main = check_main and not main_importable()
        self.table = _dispatch_table()
        self.max_items = max_items
        self.max_checks = max_checks
        self.result = BlockerList()
        self.found = 0
        self.good: set = set()
        self.bad: set = set()
        self.keep: list = []  # keeps temporaries alive so their ids are not reused mid-search

    def check(self, obj: Any) -> Optional[_Verdict]:
        if self.result.checks >= self.max_checks:
            self.result.truncated = True
            return None
        self.result.checks += 1
        return _pickle_check(obj, self.table, self.watch_main)

    @property
    def stopped(self) -> bool:
        return self.result.truncated

    def report(self, path: str, obj: Any, reason: str, main: bool = False) -> None:
        self.found += 1
        if len(self.result) < self.max_items:
            self.result.append(Blocker(path, _type_name(obj), reason, _hint(obj, main)))
        else:
            self.result.more += 1

    def visit(self, obj: Any, path: str, depth: int = 0, verdict: Optional[_Verdict] = None) -> bool:
        """Return True when ``obj`` fails (its blockers are then reported, here or below)."""
        if isinstance(obj, _ATOMIC) or self.stopped:
            return False
        oid = id(obj)
        if oid in self.bad:
            return True
        if oid in self.good:
            return False
        if verdict is None:
            verdict = self.check(obj)
            if verdict is None:
                if not self.stopped:
                    self.good.add(oid)
                    self.keep.append(obj)
                return False
        self.bad.add(oid)
        self.keep.append(obj)

        is_main = verdict.error is None and any(ref is obj for ref in verdict.main_refs)
        if isinstance(obj, (type, types.FunctionType)):
            # Pickled by reference: the object itself is the blocker. Closure cells are reported too,
            # because they would block the next attempt (e.g. a module-level function + partial).
            reason = _MAIN_REASON if is_main else _error_text(verdict)
            self.report(path, obj, reason, main=is_main)
            if depth < _MAX_DEPTH:
                self._closure(obj, path, depth)
            return True

        before = self.found
        if depth < _MAX_DEPTH:
            try:
                self.descend(obj, path, depth)
            except Exception:  # noqa: BLE001 - a failing __reduce__ makes obj itself the leaf
                pass
        if self.found == before and not self.stopped:
            self.report(path, obj, _error_text(verdict))
        return True

    def _closure(self, fn: Any, path: str, depth: int) -> None:
        cells = getattr(fn, "__closure__", None) or ()
        names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
        for name, cell in zip(names, cells):
            try:
                value = cell.cell_contents
            except ValueError:  # empty cell
                continue
            self.visit(value, f"{path}.<closure>.{name}", depth + 1)

    def descend(self, obj: Any, path: str, depth: int) -> None:
        t = type(obj)
        if t is list or t is tuple:
            self.scan(list(obj), lambda i: f"{path}[{i}]", depth, known_bad=True)
            return
        if t is dict:
            self.scan_dict(list(obj.items()), path, depth)
            return
        if t is set or t is frozenset:
            self.scan(list(obj), lambda i: f"{path}.<item {i}>", depth, known_bad=True)
            return
        if isinstance(obj, functools.partial):
            self.visit(obj.func, f"{path}.func", depth + 1)
            self.scan(list(obj.args), lambda i: f"{path}.args[{i}]", depth)
            self.scan_dict(list(obj.keywords.items()), f"{path}.keywords", depth)
            self.attrs(getattr(obj, "__dict__", None) or {}, path, depth)
            return
        if isinstance(obj, types.MethodType):
            self.visit(obj.__self__, f"{path}.__self__", depth + 1)
            return
        self.reduced(obj, path, depth)

    def reduced(self, obj: Any, path: str, depth: int) -> None:
        reducer = self.table.get(type(obj))
        rv = reducer(obj) if reducer is not None else obj.__reduce_ex__(_PROTOCOL)
        if isinstance(rv, str) or not isinstance(rv, tuple):
            return  # a global reference: obj itself is the leaf
        self.keep.append(rv)
        func, args, state, listitems, dictitems, setter = (*rv, None, None, None, None)[:6]
        args = tuple(args or ())

        if func is copyreg.__newobj__ and args:
            self.visit(args[0], f"{path}.__class__", depth + 1)
            self.scan(list(args[1:]), lambda i: f"{path}.<new args>[{i}]", depth)
        elif func is getattr(copyreg, "__newobj_ex__", None) and len(args) == 3:
            self.visit(args[0], f"{path}.__class__", depth + 1)
            self.scan(list(args[1]), lambda i: f"{path}.<new args>[{i}]", depth)
            self.scan_dict(list(dict(args[2]).items()), f"{path}.<new kwargs>", depth)
        elif func is getattr and len(args) == 2 and isinstance(args[1], str):
            self.visit(args[0], f"{path}.__self__", depth + 1)
        else:
            where = f"{path}.__class__" if func is type(obj) else f"{path}.<reduce func>"
            self.visit(func, where, depth + 1)
            self.scan(list(args), lambda i: f"{path}.<reduce args>[{i}]", depth)

        if state is not None:
            if isinstance(state, tuple) and len(state) == 2 and all(
                s is None or isinstance(s, dict) for s in state
            ):  # (__dict__, slots) as object.__reduce_ex__ gives for classes with __slots__
                for part in state:
                    self.attrs(part or {}, path, depth)
            elif isinstance(state, dict):
                self.attrs(state, path, depth)
            else:
                self.visit(state, f"{path}.<state>", depth + 1)
        if listitems is not None:
            self.scan(list(listitems), lambda i: f"{path}[{i}]", depth)
        if dictitems is not None:
            self.scan_dict(list(dictitems), path, depth)
        if setter is not None:
            self.visit(setter, f"{path}.<state setter>", depth + 1)

    def attrs(self, state: dict, path: str, depth: int) -> None:
        items = list(state.items())
        if len(items) > _LEAF_RUN or not all(isinstance(k, str) for k, _ in items):
            self.scan_dict(items, path, depth)
            return
        for key, value in items:
            self.visit(value, f"{path}.{key}", depth + 1)

    def scan_dict(self, items: list, path: str, depth: int) -> None:
        keys = [k for k, _ in items]
        values = [v for _, v in items]

        def value_path(i: int) -> str:
            text = _key_text(keys[i])
            return f"{path}[{text}]" if text is not None else f"{path}.values()[{i}]"

        self.scan(keys, lambda i: f"{path}.keys()[{i}]", depth)
        self.scan(values, value_path, depth)

    def scan(self, items: list, path_of: Callable[[int], str], depth: int, known_bad: bool = False) -> None:
        """Find the failing items of a sequence: whole-range pickles first, bisecting only failures."""
        if not items:
            return
        self.keep.append(items)
        self._scan_range(items, 0, len(items), path_of, depth, known_bad)

    def _scan_range(self, items: list, lo: int, hi: int, path_of: Callable[[int], str], depth: int,
                    known_bad: bool) -> None:
        if self.stopped:
            return
        if hi - lo <= _LEAF_RUN:
            for i in range(lo, hi):
                self.visit(items[i], path_of(i), depth + 1)
            return
        if not known_bad and self.check(items[lo:hi]) is None:
            return
        mid = (lo + hi) // 2
        self._scan_range(items, lo, mid, path_of, depth, False)
        self._scan_range(items, mid, hi, path_of, depth, False)


def _error_text(verdict: _Verdict) -> str:
    if verdict.error is not None:
        return str(verdict.error) or type(verdict.error).__name__
    names = ", ".join(_qualified(ref) for ref in verdict.main_refs[:3])
    return f"refers to {names}, {_MAIN_REASON}"


def _roots(obj: Any, name: str) -> list:
    """What a spawn worker receives: for a DataLoader, its dataset, collate_fn and worker_init_fn."""
    torch_data = sys.modules.get("torch.utils.data")
    loader_cls = getattr(torch_data, "DataLoader", None)
    if loader_cls is not None and isinstance(obj, loader_cls):
        return [(getattr(obj, part), f"{name}.{part}") for part in ("dataset", "collate_fn", "worker_init_fn")]
    return [(obj, name)]


def find_unpicklable(obj: Any, name: str = "obj", max_items: int = 20, *, check_main: bool = True,
                     max_checks: int = 2000) -> BlockerList:
    """Every attribute path of ``obj`` (named from ``name``) that stops spawn/forkserver workers from receiving
    it, as a :class:`BlockerList` (empty when it can be sent: one pickle of ``obj``, about two where not).

    ``obj`` is judged as ``DataLoader`` judges it, with ``ForkingPickler`` and its reducers (tensors are
    accepted as it would share them, without moving anything into shared memory; a non-leaf tensor that
    requires grad is reported); a ``DataLoader`` is expanded to its ``dataset``, ``collate_fn`` and
    ``worker_init_fn``. Paths follow what pickle pickles: attributes (what ``__getstate__``/``__reduce_ex__``
    return), ``index['a']``, ``items[3]``, ``collate_fn.<closure>.conn``, a partial's ``.func``/``.args[i]``,
    a bound method's ``.__self__``. ``max_items`` blockers are listed, more counted in ``.more``;
    ``check_main`` also reports classes and functions of a ``__main__`` that is no importable file (a
    notebook, ``python -c``): they pickle here, but a worker cannot import them; ``max_checks`` caps the
    pickle calls (then ``.truncated``)."""
    search = _Search(check_main, max_items, max_checks)
    for root, root_name in _roots(obj, name):
        verdict = search.check(root)
        if verdict is not None:
            search.visit(root, root_name, 0, verdict)
    return search.result


def format_blockers(blockers: list) -> str:
    """Format :func:`find_unpicklable`'s result as text lines ``path -> type: reason`` plus hints."""
    if not blockers and not getattr(blockers, "truncated", False):
        return "No pickling blockers: spawn/forkserver workers can receive this object."
    lines = []
    for b in blockers:
        lines += [str(b)] + ([f"    fix: {b.hint}"] if getattr(b, "hint", "") else [])
    if getattr(blockers, "more", 0):
        lines.append(f"... and {blockers.more} more")
    if getattr(blockers, "truncated", False):
        lines.append(f"(search stopped after {getattr(blockers, 'checks', '?')} pickle calls; there may be more "
                     "blockers: raise max_checks to look further)")
    return "\n".join(lines)

