"""Name the cause of a DataLoader failure from the evidence it left.

``explain(obj)`` takes a :class:`~labutils.runner.result.RunResult` (an isolated run: exception chains, the
exit code or signal of every worker, worker stderr, the run's limits) or a live exception caught in
the learner's own kernel (``except RuntimeError as e: labutils.explain(e)``: the exception chain, the
DataLoader iterator found in its traceback, and this process's environment). It returns a
:class:`Diagnosis`: one cause id of the catalogue (:mod:`labutils.diagnosis.causes`), a one-line summary, the
evidence used, and the fixes, each naming the notebook that demonstrates it.

How a cause is chosen
---------------------
A message counts for a cause only where it was raised. Every exception carries its origin: the
bootstrap of an isolated run records what escaped ``iter(loader)`` and ``next()``, and the frames of
each traceback say whose code raised it (the user's, ``torch.utils.data``'s, multiprocessing's). A
stderr traceback counts only when its frames show a child process printed it (a spawn child that
failed while starting, a worker, a queue feeder thread) and a failure of the run corroborates it;
stderr text alone never decides, and a run that ended well with no loader error is ``ok`` whatever
its stderr says.

Then the failure that ended the run is explained first: the exception that ended the script (or the
signal that killed it, or the stall/time limit). If that exception did not come through the
DataLoader, the cause is ``outside_loader``. Otherwise the findings of that failure (the loader's own
exceptions, the worker exit statuses, child tracebacks, the memory watchdog or the kernel's OOM record)
are ranked by :data:`PRECEDENCE`; echoes of a worker death (the generic ``exited unexpectedly``, a
fetch from a dead worker's socket, ``Pin memory thread exited unexpectedly``) are labelled as such and
decide only when nothing else does. An error the script caught earlier and survived is listed, not
chosen; when the script caught the failure and finished, it is diagnosed by that failure and the
summary says the script recovered.
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Optional

from . import probes
from .causes import CATALOGUE, CAUSES, LOADER_CAUSES, NOTEBOOKS, PRECEDENCE, UNKNOWN, UNSUPPORTED, Fix, fixes_for
from .tree import build_tree

__all__ = ["CAUSES", "LOADER_CAUSES", "PRECEDENCE", "Diagnosis", "Fix", "NOTEBOOKS", "environment_probes",
           "explain", "is_worker_death", "worker_death_kind"]


# =========================================================================== public result type
@dataclass
class Diagnosis:
    """The cause of a run or exception, with the evidence used and the fixes.

    ``cause`` is one of :data:`CAUSES` (or ``unsupported`` / ``unknown``); ``confidence`` is
    ``"high"`` (structured evidence: exit codes, signals, PyTorch's own messages where PyTorch raised
    them, the memory watchdog or the kernel's OOM record), ``"medium"`` (a message without its origin,
    a child's stderr traceback) or ``"low"`` (a fallback: a bare hang, a SIGKILL with no memory
    evidence); ``source`` is ``"run"`` for a RunResult and ``"exception"`` for a live exception.
    ``recovered`` is True when the script caught the failure and finished anyway.
    """

    cause: str
    summary: str
    evidence: list = field(default_factory=list)
    fixes: list = field(default_factory=list)
    confidence: str = "high"
    source: str = "run"
    recovered: bool = False
    #: a multi-process launch (torchrun): the first failed rank, its exit code and pid, every failure
    launch: Optional[dict] = None
    #: the process whose failure decided the cause, when it is not the main process: its role, pid, name,
    #: start method, exit code, parent and how its error reached the record (see :mod:`.tree`)
    process: Optional[dict] = None
    #: every process of the run the record knows of (main first), each with what ended it
    tree: list = field(default_factory=list)
    #: DataLoader error texts in the record that the cause does not explain (then confidence is not high)
    unexplained: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.cause == "ok"

    @property
    def blames_loader(self) -> bool:
        """True when the cause is one of the data-loading causes (not ok, outside_loader or unknown)."""
        return self.cause in LOADER_CAUSES

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        lines = [f"cause: {self.cause} ({self.confidence} confidence)", f"  {self.summary}"]
        if self.evidence:
            lines.append("evidence:")
            lines.extend(f"  - {e}" for e in self.evidence)
        if self.unexplained:
            lines.append("not explained by this cause:")
            lines.extend(f"  - {t}" for t in self.unexplained)
        if self.fixes:
            lines.append("fixes:")
            lines.extend(f"  - {f}" for f in self.fixes)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        colour = "#1a7f37" if self.cause == "ok" else "#cf222e"
        ev = "".join(f"<li>{esc(e)}</li>" for e in self.evidence)
        fx = "".join(f"<li>{esc(f.text)} <small>(<code>{esc(f.path)}</code>)</small></li>" for f in self.fixes)
        return (f"<div style='border:1px solid #d0d7de;border-radius:6px;padding:6px 10px;margin:4px 0'>"
                f"<div><b>cause: <code style='color:{colour}'>{esc(self.cause)}</code></b> "
                f"<small>({esc(self.confidence)} confidence)</small> &mdash; {esc(self.summary)}</div>"
                + (f"<div>evidence:</div><ul style='margin:2px 0'>{ev}</ul>" if ev else "")
                + (f"<div>fixes:</div><ul style='margin:2px 0'>{fx}</ul>" if fx else "")
                + "</div>")


def _fixes(cause: str, variant: Optional[str] = None) -> list:
    return fixes_for(cause, variant)


# =========================================================================== frames: whose code raised it
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')


def _frame_kind(path: str) -> str:
    """``loader`` (torch.utils.data), ``mp`` (multiprocessing, torch.multiprocessing), ``torch``, ``lib``
    (stdlib or an installed package), ``boot`` (the runner's bootstrap, runpy, a spawn child's ``-c``)
    or ``user`` (everything else: the script and its own modules)."""
    p = path.replace("\\", "/")
    if "/torch/utils/data/" in p:
        return "loader"
    if "/multiprocessing/" in p:
        return "mp"
    if "/torch/" in p or "/torch/_" in p:
        return "torch"
    if p.endswith("labutils/runner/bootstrap.py") or p.endswith("/runpy.py") or p in ("<string>", "<stdin>"):
        return "boot"
    if p.startswith("<frozen") or "/site-packages/" in p or "/dist-packages/" in p:
        return "lib"
    if re.search(r"/lib/python\d\.\d+/", p) or re.search(r"/lib/pypy", p):
        return "lib"
    if "/IPython/" in p or "/ipykernel/" in p:
        return "boot"
    return "user"


def _frames(text: str) -> list:
    """``(path, line, function, kind, source line)`` of every frame in a traceback's text."""
    out = []
    lines = (text or "").splitlines()
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if m:
            src = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
            out.append((m.group(1), int(m.group(2)), m.group(3), _frame_kind(m.group(1)), src))
    return out


def _inner_traceback(message: str) -> str:
    """The worker's traceback quoted after ``Original Traceback`` in a ``Caught X`` message."""
    _, sep, tail = (message or "").partition("Original Traceback (most recent call last):")
    return tail if sep else ""


def _inner_line(message: str) -> str:
    """The last ``Type: message`` line of the worker traceback quoted in a ``Caught X`` message."""
    tail = _inner_traceback(message)
    body = tail or message
    last = ""
    for line in body.splitlines():
        if line and not line[0].isspace() and not line.startswith("Traceback ("):
            last = line
    return last.strip() or (message.splitlines()[0] if message else "")


# =========================================================================== evidence model
@dataclass
class _Exc:
    type: str
    message: str
    traceback: str = ""
    link: Optional[str] = None
    origin: str = "ended"  # "ended" (ended the script), "next"/"init" (escaped the loader), "live"
    t: Optional[float] = None
    ended_run: bool = False  # escaped the loader and then ended the script

    def __post_init__(self) -> None:
        self.frames = [f for f in _frames(self.traceback) if f[3] != "boot"]

    @property
    def head(self) -> str:
        msg = (self.message or "").strip()
        return msg.splitlines()[0] if msg else ""

    @property
    def kinds(self) -> set:
        return {f[3] for f in self.frames}

    @property
    def raised_in(self) -> Optional[str]:
        """Kind of the innermost frame (where the exception was raised), None without frames."""
        return self.frames[-1][3] if self.frames else None


@dataclass
class _Worker:
    pid: Optional[int]
    exitcode: Optional[int]
    role: str = "dataloader_worker"
    watchdog: bool = False
    kernel_oom: bool = False
    peak_rss: Optional[int] = None


@dataclass
class _Finding:
    cause: str
    text: str
    conf: str = "high"  # high / medium / low
    detail: str = ""  # e.g. the inner worker error, for the summary
    echo: bool = False  # a consequence of a worker death, not its reason
    variant: Optional[str] = None  # a catalogue variant (summary and fixes) for this evidence
    pid: Optional[int] = None  # the process it is about, where known


@dataclass
class _Printed:
    """A traceback found in stderr, with the kind of process its frames say printed it."""

    who: str  # "child_start", "worker", "mp_child", "feeder", "other"
    body: str
    last: str


@dataclass
class _Facts:
    source: str
    ended: list = field(default_factory=list)  # the chain that ended the script (or a live chain)
    loader_errors: list = field(default_factory=list)  # chains that escaped next()/iter(), in time order
    workers: list = field(default_factory=list)
    stderr: str = ""
    outcome: Optional[str] = None
    returncode: Optional[int] = None
    main_signal: Optional[int] = None
    watchdog_kills: list = field(default_factory=list)
    iters: list = field(default_factory=list)
    options: dict = field(default_factory=dict)
    reason: Optional[str] = None
    notes: list = field(default_factory=list)
    live_dataset: Any = None
    live_findings: list = field(default_factory=list)
    memory_limit: Optional[dict] = None
    stall: Optional[dict] = None
    stacks: dict = field(default_factory=dict)
    batches: Optional[int] = None
    env: dict = field(default_factory=dict)
    kernel_record: Any = None  # callable(pids) -> dict|None, read only when a SIGKILL needs it


# --------------------------------------------------------------------------- message patterns
_WRAPPER = re.compile(r"^\W?Caught (\w[\w.]*) in (DataLoader worker process (\d+)|pin memory thread[^.]*)")
_TIMEOUT = re.compile(r"^DataLoader timed out after ([\d.]+) seconds")
_RACE_TYPES = {"FileNotFoundError", "ConnectionResetError", "ConnectionRefusedError", "EOFError",
               "BrokenPipeError", "ConnectionAbortedError"}
_RACE_FUNCS = {"rebuild_storage_fd", "rebuild_storage_filename", "recvfds", "detach", "_recv", "recv",
               "_recv_bytes", "recv_bytes", "rebuild_tensor", "rebuild_cuda_tensor", "_rebuild"}
_DIED = re.compile(r"^DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")
_KILLED = re.compile(r"^DataLoader worker \(pid (\d+)\) is killed by signal: ([^.]+)")
_EXITCODE = re.compile(r"^DataLoader worker \(pid (\d+)\) exited unexpectedly with exit code (-?\d+)")
_PIN_DIED = re.compile(r"^Pin memory thread exited unexpectedly")
_SHM = re.compile(r"unable to (allocate|open|write to|mmap)[^\n]*shared memory|"
                  r"unable to write to file </torch_|"
                  r"No space left on device[^\n]*(torch_|/dev/shm)|(torch_|/dev/shm)[^\n]*No space left on device|"
                  r"out of shared memory", re.I)
_SHM_GONE = re.compile(r"could not unlink the shared memory file|"
                       r"unable to open shared memory object[^\n]*No such file or directory")
_FD = re.compile(r"Too many open files|\[Errno 24\]|received 0 items of ancdata|EMFILE")
_FORK_REFUSED = re.compile(r"\[Errno 11\] Resource temporarily unavailable|\[Errno 12\] Cannot allocate memory|"
                           r"can't start new thread")
_THREAD_REFUSED = re.compile(r"can't start new thread")
_THREAD_FUNCS = {"start", "_start_thread", "_start_new_thread", "submit", "_adjust_thread_count", "_start"}
_FORK_FUNCS = {"_launch", "spawnv_passfds", "_Popen", "start", "_start_thread", "fork", "fork_exec"}
_CUDA = re.compile(r"Torch not compiled with CUDA enabled|re-initialize CUDA in forked subprocess|"
                   r"CUDA error|Found no NVIDIA driver|No CUDA GPUs are available|"
                   r"CUDA driver initialization failed")
_GUARD = re.compile(r"attempt has been made to start a new process before the\s+current process has "
                    r"finished its bootstrapping phase")
_MAIN_ATTR = re.compile(r"Can't get attribute '([^']+)' on <module '(__main__|__mp_main__)'")
_STDIN_MAIN = re.compile(r"No such file or directory: '[^']*<stdin>'")
_PICKLE = re.compile(r"cannot pickle|can't pickle|Can't get local object|pickle error|"
                     r"attribute lookup .* failed|is not picklable|PicklingError", re.I)
_SEGV_LINE = re.compile(r"^ERROR: Unexpected (segmentation fault|floating-point exception|bus error) "
                        r"encountered in worker", re.M)
_TORCH_WARNING = re.compile(r"^(\S*/torch/utils/data/\S+\.py):\d+: (\w+Warning): (.*)$", re.M)
# Only these exception types can carry a resource or CUDA failure; a ValueError that merely mentions
# "Too many open files" is the user's own exception.
_RESOURCE_TYPES = {"RuntimeError", "OSError", "PermissionError", "BlockingIOError", "ConnectionError",
                   "FileNotFoundError", "MemoryError", "IOError"}
_CUDA_TYPES = {"AssertionError", "RuntimeError", "AcceleratorError", "CudaError", "DeferredCudaCallError",
               "OutOfMemoryError"}
_PICKLE_TYPES = {"TypeError", "PicklingError", "AttributeError", "PickleError", "NotImplementedError"}
_SIGNAL_WORDS = {"Killed": 9, "Segmentation fault": 11, "Bus error": 7, "Aborted": 6,
                 "Floating point exception": 8, "Illegal instruction": 4, "Terminated": 15}
_NATIVE_SIGNALS = {11: "SIGSEGV", 8: "SIGFPE", 6: "SIGABRT", 4: "SIGILL", 5: "SIGTRAP", 31: "SIGSYS"}
_SIG_NAMES = {9: "SIGKILL", 7: "SIGBUS", 15: "SIGTERM", 2: "SIGINT", 1: "SIGHUP", **_NATIVE_SIGNALS}


def _signame(num: int) -> str:
    return _SIG_NAMES.get(num, f"signal {num}")


def _batches(n: int) -> str:
    return f"{n} batch" if n == 1 else f"{n} batches"


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# =========================================================================== the worker-death detector
def worker_death_kind(e) -> Optional[str]:
    """What a single exception says about a worker death, judged by PyTorch's own messages and frames.

    ``"killed"`` (killed by signal), ``"exitcode"`` (exited with a code), ``"died"`` (the generic
    ``exited unexpectedly``), ``"race"`` (the main process failed to fetch a batch from a worker that had
    already exited: a socket or fd of the dead worker gone), ``"pin"`` (the pin-memory thread's echo), or
    None. ``e`` is an exception or an internal record with ``type``, ``message`` and ``traceback``.
    """
    if isinstance(e, BaseException):
        e = _live_exc(e, None)
    head = e.head
    if _WRAPPER.match((e.message or "").strip()):
        return None  # an exception raised inside a live worker, re-raised: no death
    if _KILLED.match(head):
        return "killed"
    if _EXITCODE.match(head):
        return "exitcode"
    if _DIED.match(head):
        return "died"
    if _PIN_DIED.match(head):
        return "pin"
    if e.type in _RACE_TYPES and e.frames:
        funcs = {f[2] for f in e.frames}
        if funcs & {"rebuild_storage_fd", "rebuild_storage_filename", "recvfds"} or (
                e.kinds & {"mp"} and funcs & _RACE_FUNCS and "loader" in e.kinds | {"torch"}):
            return "race"
    return None


def is_worker_death(exc: BaseException) -> bool:
    """True when ``exc`` (or its cause chain) says a DataLoader worker process died.

    The one detector of the lab (:class:`labutils.kit.fixes.ResilientLoader` restarts on it and the
    diagnosis uses it): PyTorch's own ``DataLoader worker (pid ...) exited unexpectedly`` /
    ``... is killed by signal: ...``, and the race where the main process fails to fetch a dead worker's
    tensor (an EOFError or connection/file error raised in ``rebuild_storage_fd``/``recvfds``). An
    exception *raised by* ``__getitem__`` or collate ("Caught ValueError in DataLoader worker process 0")
    is not a death, and neither is the pin-memory thread's message on its own.
    """
    chain = [e for _, e in _chain_of(exc)]
    for e in chain:
        if _WRAPPER.match((e.message or "").strip()):
            return False
        if worker_death_kind(e) in ("killed", "exitcode", "died", "race"):
            return True
    return False


# =========================================================================== gathering
def _live_exc(exc: BaseException, link: Optional[str]) -> _Exc:
    import traceback as tb_mod

    try:
        tb = "".join(tb_mod.format_exception(type(exc), exc, exc.__traceback__, chain=False))
    except Exception:  # noqa: BLE001 - a broken __str__ must not stop the diagnosis
        tb = ""
    try:
        msg = str(exc)
    except Exception:  # noqa: BLE001
        msg = repr(exc)
    return _Exc(type(exc).__qualname__, msg, tb, link, "live")


def _chain_of(exc: BaseException) -> list:
    out, seen, link = [], set(), None
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        out.append((exc, _live_exc(exc, link)))
        if exc.__cause__ is not None:
            exc, link = exc.__cause__, "cause"
        elif exc.__context__ is not None and not exc.__suppress_context__:
            exc, link = exc.__context__, "context"
        else:
            exc = None
    return out


def _get(obj, name, default=None):
    value = getattr(obj, name, default)
    return default if value is None else value


def _facts_from_result(result) -> _Facts:
    facts = _Facts(source="run", outcome=result.outcome, returncode=result.returncode,
                   main_signal=result.signal, stderr=(result.stderr or "").replace("\r", ""),
                   watchdog_kills=list(result.watchdog_kills or []), options=dict(result.options or {}),
                   reason=result.reason)
    facts.ended = [_Exc(e.type, e.message, e.traceback, e.link, "ended") for e in result.exceptions]
    events = list(result.loader_events or [])
    for ev in events:
        kind = ev.get("event")
        if kind in ("error", "init_error") and ev.get("chain"):
            origin = "init" if kind == "init_error" else "next"
            chain = [_Exc(c.get("type", "?"), c.get("message", ""), c.get("traceback", ""), c.get("link"),
                          origin, ev.get("t")) for c in ev["chain"]]
            facts.loader_errors.append(chain)
    facts.iters = [ev for ev in events if ev.get("event") == "iter"]
    progress = [ev for ev in events if ev.get("event") == "progress" and isinstance(ev.get("batches"), int)]
    extra = getattr(result, "progress", None)
    if isinstance(extra, (list, tuple)):
        progress += [p for p in extra if isinstance(p, dict) and isinstance(p.get("batches"), int)]
    per_iter: dict = {}
    for ev in progress:  # batches delivered so far by each iterator: the last count of each, summed
        key = ev.get("iter")
        per_iter[key] = max(per_iter.get(key, 0), ev["batches"])
    if isinstance(extra, int):
        per_iter = {None: extra}
    facts.batches = sum(per_iter.values()) if per_iter else None
    for w in result.workers:
        facts.workers.append(_Worker(w.pid, w.exitcode, w.role, bool(w.killed_by_watchdog),
                                     bool(getattr(w, "killed_by_kernel_oom", False)), w.peak_rss))
    facts.memory_limit = getattr(result, "memory_limit", None)
    facts.stall = getattr(result, "stall", None)
    facts.stacks = dict(getattr(result, "stacks", None) or {})
    facts.env = dict(facts.options.get("env") or {})
    facts.kernel_record = probes.kernel_oom_record
    return facts


def _find_loader_iter(excs: Iterable[BaseException]):
    """The DataLoader iterator object in the traceback of any exception of the chain, if any."""
    for exc in excs:
        tb = exc.__traceback__
        while tb is not None:
            obj = tb.tb_frame.f_locals.get("self")
            if obj is not None and type(obj).__name__.endswith("DataLoaderIter"):
                return obj
            tb = tb.tb_next
    return None


def _facts_from_exception(exc: BaseException) -> _Facts:
    facts = _Facts(source="exception", outcome="failed")
    pairs = _chain_of(exc)
    facts.ended = [e for _, e in pairs]
    facts.notes.append("explained from the exception chain and this process's environment only: worker "
                       "stderr and the exit codes of workers that are gone are not available here "
                       "(run it with labutils.run_isolated or `python -m labutils diagnose` for those)")
    it = _find_loader_iter([e for e, _ in pairs])
    if it is not None:
        workers = list(getattr(it, "_workers", []) or [])
        method = None
        for w in workers:
            try:
                code = w.exitcode
            except Exception:  # noqa: BLE001
                code = None
            facts.workers.append(_Worker(getattr(w, "pid", None), code))
            method = method or getattr(type(w), "_start_method", None)
        if workers and method is None:  # the default context: its Process class names no method
            method = probes.default_start_method()
        ds = getattr(it, "_dataset", None)
        facts.live_dataset = ds
        ds_module = type(ds).__module__ if ds is not None else None
        codes = [w.exitcode for w in facts.workers]
        if (method in ("spawn", "forkserver") and ds_module == "__main__"
                and not probes.main_importable() and any(c == 1 for c in codes)):
            facts.live_findings.append(_Finding(
                "main_not_importable", f"workers exited with code 1 at start-up under {method}, and the "
                f"dataset class {type(ds).__qualname__} lives in this __main__, which has no file to import "
                "it from", conf="medium"))
        facts.iters.append({"event": "iter", "num_workers": getattr(it, "_num_workers", None),
                            "timeout": getattr(it, "_timeout", None), "start_method": method,
                            "dataset": type(ds).__module__ + "." + type(ds).__qualname__ if ds is not None
                            else None})
    facts.env = dict(os.environ)
    facts.kernel_record = probes.kernel_oom_record
    return facts


# =========================================================================== origin
def _through_loader(e: _Exc) -> Optional[bool]:
    """Did this exception come out of the DataLoader (its iterator, its worker start, a re-raise)?

    True for what the bootstrap caught escaping ``iter()``/``next()``, for any traceback with a frame
    of torch.utils.data, and for one through torch's tensor sharing (``torch.multiprocessing.reductions``,
    how a worker's batch reaches the main process); False for a traceback without one; None when there
    is no traceback at all (an exception built by hand: only its message is left to judge).
    """
    if e.origin in ("next", "init"):
        return True
    if not e.frames:
        return None
    if any(f[0].replace("\\", "/").endswith("torch/multiprocessing/reductions.py") for f in e.frames):
        return True  # torch's tensor sharing between processes: the IPC every DataLoader batch goes through
    return "loader" in e.kinds or worker_death_kind(e) == "race"


def _is_echo_of_death(e: _Exc) -> bool:
    return worker_death_kind(e) in ("died", "race", "pin")


# =========================================================================== rules for one exception
def _classify(e: _Exc, where: str, single_process: bool) -> list:
    """Findings from one exception that came through the loader (or whose origin is unknown)."""
    msg = e.message or ""
    head = e.head
    bare = _through_loader(e) is None
    conf = "medium" if bare else "high"
    m = _WRAPPER.match(msg.strip())
    if m:
        return [_classify_wrapper(e, m, where, conf)]
    if _TIMEOUT.match(head):
        return [_Finding("timeout", f"{where}: {e.type}: {_short(head)}", conf)]
    kind = worker_death_kind(e)
    if kind == "race":
        return [_Finding("_died", f"{where}: {e.type}: {_short(head)} - raised while receiving a batch from "
                         "a worker that had already exited (its end of the fd-passing socket is gone): an echo "
                         "of the worker's death; its exit status says why", "low", echo=True)]
    if kind == "killed":
        km = _KILLED.match(head)
        word = km.group(2).strip()
        sig = next((n for w, n in _SIGNAL_WORDS.items() if word.startswith(w)), None)
        text = f"{where}: PyTorch reports worker pid {km.group(1)} killed by signal: {word}"
        cause = _cause_for_signal(sig) if sig else "worker_exit"
        if sig == 9:  # PyTorch saw a SIGKILL; whether it was for memory needs memory evidence
            return [_Finding(cause, text + " (SIGKILL: the OOM killer's signal, and also that of kill -9 and "
                             "preemptions)", "low", variant="no_memory_evidence", pid=int(km.group(1)))]
        return [_Finding(cause, text, conf, detail=str(sig or ""),
                         variant="sigterm" if sig == 15 else None, pid=int(km.group(1)))]
    if kind == "exitcode":
        em = _EXITCODE.match(head)
        return [_Finding("worker_exit", f"{where}: PyTorch reports worker pid {em.group(1)} exited with exit "
                         f"code {em.group(2)}", "medium", detail=f"code {em.group(2)}")]
    if kind == "died":
        return [_Finding("_died", f"{where}: {e.type}: {_short(head)} (the generic message: an echo of the "
                         "death; the reason is in the chain below it and in the worker exit status)", "low",
                         echo=True)]
    if kind == "pin":
        return [_Finding("_died", f"{where}: {e.type}: {_short(head)} (the pin-memory thread stopped because "
                         "a worker or the loader failed first: an echo)", "low", echo=True)]
    funcs = {f[2] for f in e.frames}
    spawn_frames = bool(e.kinds & {"mp"})
    if _GUARD.search(msg) and (bare or spawn_frames):
        return [_Finding("missing_main_guard", f"{where}: {e.type}: {_short(head)}", conf)]
    if _MAIN_ATTR.search(msg) and (bare or spawn_frames) and e.raised_in != "user":
        return [_Finding("main_not_importable", f"{where}: {e.type}: {_short(head)}", conf)]
    if (e.type in _RESOURCE_TYPES and _FORK_REFUSED.search(msg)
            and (bare or (spawn_frames and funcs & _FORK_FUNCS)
                 or (_THREAD_REFUSED.search(msg) and funcs & _THREAD_FUNCS))):
        thread = "thread" in msg
        return [_Finding("fork_refused", f"{where}: {e.type}: {_short(head)} - the kernel refused a new "
                         + ("thread" if thread else "process") + " for the DataLoader", conf,
                         variant="thread" if thread else None)]
    if e.type in _RESOURCE_TYPES and _SHM_GONE.search(msg):
        return [_Finding("shm_exhausted", f"{where}: {e.type}: {_short(head)} - the file of a batch in flight "
                         "was gone from /dev/shm (deleted under the loader, not a full /dev/shm)", conf,
                         variant="removed")]
    if e.type in _RESOURCE_TYPES and _SHM.search(msg):
        return [_Finding("shm_exhausted", f"{where}: {e.type}: {_short(head)}", conf)]
    if e.type in _RESOURCE_TYPES and _FD.search(msg):
        if e.raised_in in ("user", "lib") and "mp" not in e.kinds:
            line = next((f for f in reversed(e.frames) if f[3] in ("user", "lib")), None)
            at = f" at {os.path.basename(line[0])}:{line[1]} in {line[2]}" if line else ""
            return [_Finding("fd_limit", f"{where}: {e.type}: {_short(head)} - raised by the Dataset's own "
                             f"file opening{at}", conf, variant="user_leak",
                             detail=f"{line[2]}: {line[4]}" if line else "")]
        return [_Finding("fd_limit", f"{where}: {e.type}: {_short(head)}", conf)]
    if e.type in _CUDA_TYPES and _CUDA.search(msg):
        return [_Finding("cuda_in_worker", f"{where}: {e.type}: {_short(head)}"
                         + (" (CUDA touched by the Dataset in the main process, num_workers=0)"
                            if single_process and not bare else ""), conf)]
    if (e.type in _PICKLE_TYPES and _PICKLE.search(msg)
            and (bare or (spawn_frames and funcs & {"dump", "dumps", "_launch", "start", "__init__", "_Popen",
                                                   "reduce", "_send", "send"} and e.raised_in != "user"))):
        return [_Finding("unpicklable_dataset", f"{where}: {e.type}: {_short(head)} (raised while sending "
                         "the dataset/collate_fn/worker_init_fn to a new worker)", conf)]
    return []


def _classify_wrapper(e: _Exc, m, where: str, conf: str) -> _Finding:
    inner_type, place = m.group(1), m.group(2)
    inner = _inner_line(e.message)
    inner_frames = [f for f in _frames(_inner_traceback(e.message)) if f[3] != "boot"]
    said = f"{where}: {e.type} 'Caught {inner_type} in {place}' - inner error: {_short(inner)}"
    if inner_type in _RESOURCE_TYPES and _THREAD_REFUSED.search(inner):
        return _Finding("fork_refused", said + " (the kernel refused a thread the worker's code started)", conf,
                        variant="thread")
    if inner_type in _RESOURCE_TYPES and _SHM.search(inner):
        return _Finding("shm_exhausted", said + " (a shared-memory allocation failed in the worker)", conf)
    if inner_type in _RESOURCE_TYPES and _FD.search(inner):
        last = inner_frames[-1] if inner_frames else None
        if last is not None and last[3] in ("user", "lib") and not any(f[3] == "mp" for f in inner_frames):
            return _Finding("fd_limit", said + f" (raised at {os.path.basename(last[0])}:{last[1]} in "
                            f"{last[2]}: the Dataset's own code opening files, not the loader's IPC)", conf,
                            variant="user_leak", detail=f"{last[2]}: {last[4]}" if last[4] else last[2])
        return _Finding("fd_limit", said + " (the worker ran out of file descriptors)", conf)
    if inner_type in _CUDA_TYPES and _CUDA.search(inner):
        return _Finding("cuda_in_worker", said + " (CUDA used inside a DataLoader worker)", conf)
    return _Finding("worker_exception", said, conf, detail=_short(inner, 120))


def _cause_for_signal(sig: Optional[int]) -> str:
    if sig == 9:
        return "oom_killed"
    if sig == 7:
        return "shm_exhausted"
    if sig in _NATIVE_SIGNALS:
        return "native_crash"
    return "worker_exit"


# =========================================================================== stderr, by who printed it
def _tracebacks(text: str) -> list:
    """``(body, last_line)`` of every Python traceback printed in ``text``.

    Two processes that fail at the same moment (two spawned workers) write to one stderr, and their lines
    interleave, each line whole (stderr is line-buffered). Two such tracebacks are mostly the same lines,
    so within one traceback a line already seen (another ``Traceback`` header, a frame, the exception line,
    a line of its message) is taken for the other process's copy and skipped."""
    out = []
    lines = text.splitlines()
    header = "Traceback (most recent call last):"
    i = 0
    while i < len(lines):
        if lines[i].strip().startswith(header):
            indent = len(lines[i]) - len(lines[i].lstrip())
            body, seen = [], {lines[i].strip()}
            j = i + 1
            while j < len(lines):
                line = lines[j].strip()
                if line and line in seen:
                    pass  # the other process's copy of a line of this traceback
                elif len(lines[j]) - len(lines[j].lstrip()) > indent or not line:
                    body.append(lines[j])
                    seen.add(line)
                else:
                    break
                j += 1
            # a multi-line message (the guard's text) continues on indented lines after the type line
            first = lines[j].strip() if j < len(lines) else ""
            last_lines = [first]
            seen.add(first)
            k = j + 1
            while k < len(lines):
                line = lines[k].strip()
                if line and line in seen:
                    pass
                elif lines[k].startswith((" ", "\t")) and not line.startswith(("File ", "Traceback")):
                    last_lines.append(line)
                    seen.add(line)
                else:
                    break
                k += 1
            out.append(("\n".join(body), " ".join(x for x in last_lines if x)))
            i = j + 1
        else:
            i += 1
    return out


def _printed(stderr: str) -> list:
    """Tracebacks in stderr, each with the kind of process its frames show printed it."""
    out = []
    for body, last in _tracebacks(stderr):
        if re.search(r"multiprocessing[/\\](spawn|forkserver)\.py\", line \d+, in (_main|spawn_main|main)",
                     body):
            who = "child_start"
        elif re.search(r"torch[/\\]utils[/\\]data[/\\]_utils[/\\]worker\.py", body):
            who = "worker"
        elif re.search(r"multiprocessing[/\\](queues|resource_sharer)\.py\", line \d+, in (_feed|_serve)", body):
            who = "feeder"
        elif re.search(r"multiprocessing[/\\]process\.py\", line \d+, in _bootstrap", body):
            who = "mp_child"
        else:
            who = "other"
        out.append(_Printed(who, body, last))
    return out


_WHO = {"child_start": "a spawned child printed while starting", "worker": "a worker printed",
        "feeder": "a multiprocessing helper thread (queue feeder, fd sharer) printed",
        "mp_child": "a child process printed"}


def _stderr_findings(facts: _Facts) -> list:
    """Findings from tracebacks that child processes printed (each says which kind of process)."""
    found, seen = [], set()
    for p in _printed(facts.stderr):
        if p.who == "other" or not p.last:
            continue
        text, cause = p.last, None
        if _THREAD_REFUSED.search(text) and p.who in ("worker", "feeder", "mp_child", "child_start"):
            cause = "fork_refused"  # a thread the process needed: its queue feeder, the fd sharer, its own
        elif _GUARD.search(text):
            cause = "missing_main_guard"
        elif _MAIN_ATTR.search(text) and p.who == "child_start":
            cause = "main_not_importable"
        elif _STDIN_MAIN.search(text) and p.who == "child_start":
            cause = "main_not_importable"
        elif _SHM.search(text):
            cause = "shm_exhausted"
        elif _FD.search(text):
            cause = "fd_limit"
        elif _CUDA.search(text) and p.who in ("worker", "child_start", "mp_child"):
            cause = "cuda_in_worker"
        elif _PICKLE.search(text) and p.who in ("child_start", "feeder"):
            cause = "unpicklable_dataset"
        elif p.who == "child_start":
            cause = "worker_exit"
        if cause is None or (cause, text) in seen:
            continue
        seen.add((cause, text))
        variant = "startup" if cause == "worker_exit" else "thread" if cause == "fork_refused" else None
        found.append(_Finding(cause, f"stderr: {_WHO[p.who]}: {_short(text)}" + (
            " - the kernel refused a thread the process needed" if cause == "fork_refused" else ""), "medium",
            detail=text if cause == "worker_exit" else "", variant=variant))
    for m in _TORCH_WARNING.finditer(facts.stderr):
        path, category, text = m.groups()
        if re.search(r"Got pickle error when attempting to start a worker Process", text):
            found.append(_Finding("unpicklable_dataset", f"stderr: {category} from {os.path.basename(path)} "
                                  f"(torch.utils.data): {_short(text)}", "medium"))
            break
    return found


# =========================================================================== worker statuses and memory
def _memory_evidence(facts: _Facts, pid: Optional[int], main: bool = False) -> Optional[str]:
    """Why we believe a SIGKILL of ``pid`` was for memory, or None when nothing says so."""
    for k in facts.watchdog_kills:
        if (main and k.get("main")) or (not main and k.get("pid") == pid):
            return (f"the lab's memory watchdog SIGKILLed it at {(k.get('rss') or 0) / 2**20:.0f} MiB RSS "
                    f"(budget {(k.get('budget') or 0) / 2**20:.0f} MiB) - its stand-in for the kernel OOM killer")
    w = next((w for w in facts.workers if w.pid == pid), None)
    if w is not None and w.watchdog:
        return "the lab's memory watchdog SIGKILLed it (its stand-in for the kernel OOM killer)"
    ml = facts.memory_limit or {}
    rec = ml.get("kernel_record") if isinstance(ml, dict) else None
    if isinstance(rec, dict) and (rec.get("oom_kill") or 0) > 0:
        killed, named = kernel_killed(facts)
        if (pid in killed) or main and rec.get("main_killed") or (not killed and not main):
            how = ("the kernel log names this pid" if named else
                   "the run's memory cgroup counted the kill as it died by SIGKILL; the kernel log was not "
                   "readable to name the pid")
            return (f"the kernel's OOM killer: the run's memory cgroup records oom_kill {rec.get('oom_kill')} "
                    f"({how}; limit {(ml.get('limit') or 0) / 2**20:.0f} MiB)")
    limit = ml.get("limit") if isinstance(ml, dict) else None
    if limit and w is not None and w.peak_rss and w.peak_rss >= 0.8 * limit:
        return (f"its memory climbed to {w.peak_rss / 2**20:.0f} MiB RSS, near the run's limit of "
                f"{limit / 2**20:.0f} MiB")
    if facts.kernel_record is not None and pid:
        try:
            rec = facts.kernel_record([pid])
        except Exception:  # noqa: BLE001 - a probe never breaks a diagnosis
            rec = None
        if rec:
            return f"the kernel log names it: {_short((rec.get('lines') or [''])[0], 140)}"
    return None


def kernel_killed(facts: _Facts) -> tuple:
    """(pids the kernel's OOM killer killed, whether the kernel log named them).

    The kernel log's ``Killed process N`` lines name the pid; without them the runner guessed, from the
    order in which processes died while the cgroup's ``oom_kill`` counter rose, and that guess can land on
    a worker that the loader stopped a moment later (exit -15, or 0). The guess is kept only for pids that
    died by SIGKILL; when it names none of them, the run's SIGKILLed workers are the ones, if there are no
    more of them than the counter's kills."""
    ml = facts.memory_limit if isinstance(facts.memory_limit, dict) else {}
    rec = ml.get("kernel_record") if isinstance(ml.get("kernel_record"), dict) else {}
    pids = list(rec.get("killed_pids") or [])
    if rec.get("killed_pids_from") == "dmesg":
        return set(pids), True
    codes = {w.pid: w.exitcode for w in facts.workers}
    sigkilled = {p for p, c in codes.items() if c == -9}
    kept = {p for p in pids if codes.get(p) in (-9, None) and (p in sigkilled or p not in codes)}
    if kept:
        return kept, False
    count = rec.get("oom_kill") or 0
    if sigkilled and len(sigkilled) <= count:
        return sigkilled, False
    return set(), False


_OTHER_SIGKILL = ("a `kill -9`, a scheduler's preemption (SLURM, Kubernetes), `timeout -s KILL`, the "
                  "kernel OOM killer")


def _worker_findings(facts: _Facts) -> list:
    found = []
    for w in facts.workers:
        if w.exitcode is None or w.exitcode == 0:
            continue
        who = "DataLoader worker" if w.role == "dataloader_worker" else "child process"
        if w.exitcode < 0:
            sig = -w.exitcode
            text = f"{who} pid {w.pid}: killed by {_signame(sig)}"
            cause = _cause_for_signal(sig)
            if sig == 9:
                why = _memory_evidence(facts, w.pid)
                if why:
                    found.append(_Finding("oom_killed", f"{text} - {why}", "high", pid=w.pid))
                else:
                    found.append(_Finding("oom_killed", f"{text}; no memory evidence recorded (no watchdog kill, "
                                          "no kernel OOM record): any of " + _OTHER_SIGKILL + " may have sent "
                                          "it", "low", variant="no_memory_evidence", pid=w.pid))
            elif sig == 15:
                found.append(_Finding("worker_exit", f"{text} (SIGTERM: sent from outside the worker, or by the "
                                      "DataLoader's own shutdown of a worker that did not stop)", "low",
                                      variant="sigterm", detail="15"))
            else:
                found.append(_Finding(cause, text, "high", detail=str(sig)))
        elif w.exitcode == 1:  # what Python exits with after an uncaught exception: a traceback is missing
            found.append(_Finding("worker_exit", f"{who} pid {w.pid}: exited with code 1 (no signal; 1 is also "
                                  "the status of a Python process that died of an uncaught exception, whose "
                                  "traceback would be on stderr)", "medium", detail="code 1"))
        else:
            found.append(_Finding("worker_exit", f"{who} pid {w.pid}: exited with code {w.exitcode} "
                                  "(no signal: the worker's own exit)", "high" if w.role == "dataloader_worker"
                                  else "medium", detail=f"code {w.exitcode}"))
    worker_pids = {w.pid for w in facts.workers}
    for k in facts.watchdog_kills:
        if k.get("main"):
            continue
        if k.get("pid") not in worker_pids:
            found.append(_Finding("oom_killed", f"pid {k.get('pid')} SIGKILLed by the lab's memory watchdog at "
                                  f"{(k.get('rss') or 0) / 2**20:.0f} MiB RSS (budget "
                                  f"{(k.get('budget') or 0) / 2**20:.0f} MiB)", "high"))
    return found


def _main_signal_findings(facts: _Facts) -> list:
    sig = facts.main_signal
    if facts.outcome != "failed" or not sig:
        return []
    if sig == 9:
        why = _memory_evidence(facts, None, main=True)
        if why:
            return [_Finding("oom_killed", f"main process killed by SIGKILL - {why}", "high")]
        return [_Finding("oom_killed", "main process killed by SIGKILL; no memory evidence recorded: any of "
                         + _OTHER_SIGKILL + " may have sent it", "low", variant="no_memory_evidence")]
    if sig in _NATIVE_SIGNALS or sig == 7:
        return [_Finding("_main_native", f"main process killed by {_signame(sig)} (native code crashed in the "
                         "main process)", "high", detail=str(sig))]
    return [_Finding("_main_stopped", f"main process killed by {_signame(sig)}", "high", detail=str(sig))]


def _stall_findings(facts: _Facts) -> list:
    found = []
    if facts.stall:
        s = facts.stall
        found.append(_Finding("hang", f"no batch for {s.get('idle_s', s.get('limit', '?'))} s while workers were "
                              f"alive (stall limit {s.get('limit')} s), after {s.get('batches', '?')} batches: "
                              "the runner stopped it", "high"))
    elif facts.outcome == "timed_out":
        found.append(_Finding("hang", f"no result before the run's time limit: {facts.reason or 'timed out'}",
                              "low"))
    if facts.outcome == "timed_out" or facts.stall:
        where = _stuck_where(facts.stderr)
        if where:
            found.append(_Finding("hang", where, "medium"))
    return found


def _stuck_where(stderr: str) -> str:
    """What the faulthandler dump taken before the runner's kill says the main process was doing."""
    dump = stderr[stderr.rfind("most recent call first"):] if "most recent call first" in stderr else ""
    if not dump:
        return ""
    if re.search(r"in (_try_get_data|_get_data|_next_data)\b", dump):
        return ("faulthandler dump: the main process was waiting for a batch from the workers "
                "(DataLoader _try_get_data), and none came")
    if re.search(r"in _launch", dump):
        return "faulthandler dump: the main process was blocked starting a worker (sending it the dataset)"
    m = re.search(r'File "([^"]+)", line (\d+) in (\w+)', dump)
    return f"faulthandler dump: the main process was in {m.group(3)} ({m.group(1)}:{m.group(2)})" if m else ""


def _stack_lines(facts: _Facts) -> list:
    """One line per stack the runner dumped on a stall: the innermost frame of each process."""
    lines = []
    for pid, text in list(facts.stacks.items())[:8]:
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', text or "")
        if frames:
            path, line, func = frames[0]  # faulthandler prints the innermost frame first
            user = next((f for f in frames if _frame_kind(f[0]) == "user"), None)
            extra = f", called from {os.path.basename(user[0])}:{user[1]} in {user[2]}" if user and \
                user != frames[0] else ""
            lines.append(f"stack of pid {pid}: in {func} ({os.path.basename(path)}:{line}){extra}")
    return lines


# =========================================================================== choosing
def _single_process(facts: _Facts) -> bool:
    """True when the DataLoader ran without workers (or we cannot tell and no worker was seen)."""
    counts = [it.get("num_workers") for it in facts.iters if it.get("num_workers") is not None]
    if counts:
        return all(n == 0 for n in counts)
    return not facts.workers


def _pick(findings: list, facts: Optional[_Facts] = None) -> tuple:
    """(cause, its findings, confidence) by precedence; echoes decide only when nothing else does."""
    real = [f for f in findings if not f.echo and not f.cause.startswith("_")]
    for cause in PRECEDENCE:
        mine = [f for f in real if f.cause == cause]
        if mine:
            rank = {"high": 0, "medium": 1, "low": 2}
            best = min(mine, key=lambda f: rank[f.conf])
            mine.remove(best)
            mine.insert(0, best)
            conf = best.conf
            same_exit = cause == "worker_exit" and all(f.detail == "code 1" for f in mine)
            if conf == "medium" and len(mine) > 1 and cause != "oom_killed" and not same_exit:
                conf = "high"  # two independent pieces of evidence for the same cause (not one exit code twice)
            if cause == "oom_killed":
                conf = "high" if any(f.conf == "high" for f in mine) else "low"
                if conf == "low" and facts is not None:
                    for f in mine:
                        why = _memory_evidence(facts, f.pid) if f.pid else None
                        if why:
                            mine.insert(0, _Finding("oom_killed", f"pid {f.pid}: {why}", "high", pid=f.pid))
                            conf = "high"
                            break
            if cause == "hang" and not (facts is not None and facts.stall):
                conf = "low" if all(f.conf == "low" for f in mine) else "medium"
            return cause, mine, conf
    echoes = [f for f in findings if f.cause == "_died"]
    if echoes:
        return "worker_exit", echoes, "low"
    return None, [], "high"


def _chain_where(e: _Exc) -> str:
    base = {"ended": "exception that ended the script", "next": "exception from the DataLoader",
            "init": "exception while creating the DataLoader iterator (starting its workers)",
            "live": "the exception"}[e.origin]
    if e.origin in ("next", "init") and e.ended_run:
        base += ", which ended the script"
    elif e.origin in ("next", "init"):
        base += " (caught by the script)"
    return base if e.link is None else f"its __{e.link}__"


def _loader_chain_findings(chain: list, single: bool) -> list:
    out = []
    for e in chain:
        out.extend(_classify(e, _chain_where(e), single))
    return out


def _episode(facts: _Facts, chain: Optional[list]) -> list:
    """Every finding of one loader failure: its chain, the workers, child tracebacks, memory, stalls."""
    single = _single_process(facts)
    findings = _loader_chain_findings(chain or [], single)
    findings += _worker_findings(facts)
    findings += facts.live_findings
    printed = _stderr_findings(facts)
    # a child's traceback is corroborated by a death the OS or PyTorch recorded: then it is strong
    died = any(f.echo or (f.cause == "worker_exit" and f.conf == "high") for f in findings)
    capped = bool((facts.options or {}).get("max_processes"))
    for f in printed:
        if died and f.text.startswith("stderr: a spawned child"):
            f.conf = "high"
        elif f.cause == "fork_refused" and (died or capped):
            f.conf = "high"  # the process that printed it died, or the run had a task cap: no mere chatter
    return findings + printed


def _same_chain(a: list, b: list) -> bool:
    return bool(a and b) and [(e.type, e.message) for e in a] == [(e.type, e.message) for e in b]


def _fallback_single(e: _Exc, single: bool) -> Optional[_Finding]:
    """An exception that escaped a single-process DataLoader: the Dataset raised it in the main process."""
    if _through_loader(e) and single:
        line = next((f for f in reversed(e.frames) if f[3] == "user"), None)
        at = f" at {os.path.basename(line[0])}:{line[1]} in {line[2]}" if line else ""
        return _Finding("worker_exception", f"{e.type}: {_short(e.message)} escaped the DataLoader iterator "
                        f"(raised by the Dataset/collate_fn in the main process, num_workers=0){at}",
                        "high" if e.frames or e.origin in ("next", "init") else "medium",
                        detail=f"{e.type}: {_short(e.message, 120)}")
    return None


def _outside_finding(e: _Exc) -> _Finding:
    line = next((f for f in reversed(e.frames) if f[3] == "user"), None)
    last = e.frames[-1] if e.frames else None
    where = ""
    if line:
        where = f" (your code: {os.path.basename(line[0])}:{line[1]} in {line[2]}"
        if last is not None and last is not line:
            where += f"; raised in {_lib_name(last[0])}"
        where += ")"
    return _Finding("outside_loader", f"the script failed outside data loading: {e.type}: {_short(e.message)}"
                    f"{where} - no frame of torch.utils.data in its traceback", "high",
                    detail=f"{e.type}: {_short(e.message, 120)}")


def _lib_name(path: str) -> str:
    p = path.replace("\\", "/")
    m = re.search(r"/(torch/[\w/]+?)\.py$", p)
    if m:
        return m.group(1).replace("/", ".")
    m = re.search(r"/(?:site-packages|dist-packages|python\d\.\d+)/([\w/]+?)\.py$", p)
    return m.group(1).replace("/", ".") if m else os.path.basename(p)


def _decide(facts: _Facts) -> tuple:
    """(cause, findings for it, confidence, other findings, recovered)."""
    single = _single_process(facts)
    ended = facts.ended
    others: list = []
    loader_chain = None
    if ended:
        # the link of the ending chain that came through the loader, if any (a user's exception raised
        # while handling a loader error has the loader error as its __context__)
        origins = [_through_loader(e) for e in ended]
        match = next((c for c in facts.loader_errors if _same_chain(ended, c)), None)
        if match is not None:
            loader_chain = match  # the same chain escaped next()/iter(): the loader raised it
            for e in match:
                e.ended_run = True
        elif any(o is True for o in origins):
            loader_chain = ended
        elif all(o is None for o in origins):
            loader_chain = ended  # no traceback to tell: judge the messages (an exception built by hand)
        if loader_chain is not None and origins[0] is False and match is None:
            # the script's own exception, raised while handling (or from) one that came through the
            # loader: the loader's error is the reason only if it names a loader failure
            linked = [e for e, o in zip(ended, origins) if o is True]
            if not [f for f in _loader_chain_findings(linked, single) if not f.cause.startswith("_")
                    or f.echo]:
                loader_chain = None
        if loader_chain is None:
            # the script ended with an exception the loader did not raise: the loader is not to blame,
            # whatever it went through before (errors the script caught and survived are listed)
            for c in facts.loader_errors:
                others += _loader_chain_findings(c, single)
            head = ended[0]
            mine = [_outside_finding(head)]
            if facts.batches:
                mine.append(_Finding("outside_loader", f"the DataLoader had delivered {_batches(facts.batches)} "
                                     "before it", "high"))
            return "outside_loader", mine, "high", others, False
        findings = _episode(facts, loader_chain)
        findings += _main_signal_findings(facts)
        cause, mine, conf = _pick(findings, facts)
        if cause is None:
            fb = _fallback_single(loader_chain[0], single) if loader_chain else None
            if fb is not None:
                return "worker_exception", [fb], fb.conf, findings, False
            if all(o is None for o in origins):
                return UNKNOWN, [_Finding(UNKNOWN, f"{ended[0].type}: {_short(ended[0].message)} - nothing in "
                                          "it names a DataLoader failure, and it has no traceback to say where "
                                          "it was raised", "medium")], "medium", [], False
            # through the loader but no rule names it: a Python exception of the loader's caller
            return "worker_exception", [_Finding("worker_exception", f"{ended[0].type}: "
                                                 f"{_short(ended[0].message)} (raised inside the DataLoader)",
                                                 "medium", detail=f"{ended[0].type}: {_short(ended[0].message, 120)}")
                                        ], "medium", findings, False
        for c in facts.loader_errors:
            if not _same_chain(c, loader_chain):
                others += [f for f in _loader_chain_findings(c, single) if f.cause != cause]
        return cause, mine, conf, [f for f in findings if f not in mine] + others, False

    # the script ended without a Python exception: a signal, a stall or time limit, an exit code, or 0
    main = _main_signal_findings(facts)
    last_loader = facts.loader_errors[-1] if facts.loader_errors else None
    if main and main[0].cause == "_main_native":
        sig = int(main[0].detail)
        stack = _fatal_stack(facts.stderr)
        in_loader = ("loader" in {k for _, k in stack}) if stack else None
        if sig == 6 and facts.iters and _SHM_GONE.search(facts.stderr):  # C++ terminate() on a deleted file
            f = _Finding("shm_exhausted", main[0].text + ": torch's C++ code aborted with 'could not unlink the "
                         "shared memory file' - a batch's file was deleted from /dev/shm under the loader",
                         "high", variant="removed")
            return "shm_exhausted", [f], "high", _episode(facts, last_loader), False
        if single and facts.iters and in_loader is not False:
            f = _Finding("native_crash", main[0].text + ("; its Python stack runs through torch.utils.data"
                                                          if in_loader else "; the DataLoader ran with "
                                                          "num_workers=0, so the Dataset ran in this process"),
                         "high" if in_loader else "medium", variant="main_process", detail=str(sig))
            return "native_crash", [f], f.conf, _episode(facts, last_loader), False
        findings = _episode(facts, last_loader)
        cause, mine, conf = _pick(findings, facts)
        if cause is not None and cause != "worker_exit":
            return cause, mine, conf, [main[0]], False
        what = ("its Python stack shows no frame of torch.utils.data" if stack else
                "no DataLoader was iterated" if not facts.iters else
                "the DataLoader's workers did not fail")
        return "outside_loader", [_Finding("outside_loader", f"{main[0].text}; {what}", "medium" if not stack
                                           else "high")], "medium" if not stack else "high", findings, False
    if main and main[0].cause == "_main_stopped":
        sig = int(main[0].detail)
        findings = _episode(facts, last_loader)
        senders = probes.sigterm_senders(facts.env or os.environ) if sig == 15 else []
        who = f"; likely sender here: {'; '.join(senders)}" if senders else (
            "; nothing in the environment names a scheduler: a person's kill, a launcher or a service manager"
            if sig == 15 else "")
        f = _Finding("outside_loader", f"{main[0].text}: the script was stopped from outside{who}", "medium")
        return "outside_loader", [f], "medium", findings, False
    if main:  # SIGKILL of the main process
        findings = _episode(facts, last_loader) + main
        cause, mine, conf = _pick(findings, facts)
        return cause, mine, conf, [f for f in findings if f not in mine], False
    if facts.outcome == "timed_out" or facts.stall:
        findings = _episode(facts, last_loader) + _stall_findings(facts)
        cause, mine, conf = _pick(findings, facts)
        # SIGTERMs of workers the runner's own kill caused, and the like, are consequences of the stop
        return cause, mine, conf, [f for f in findings if f not in mine], False
    if facts.outcome == "failed":
        if last_loader is not None:
            findings = _episode(facts, last_loader)
            cause, mine, conf = _pick(findings, facts)
            if cause is not None:
                return cause, mine, conf, [f for f in findings if f not in mine], False
        findings = _episode(facts, None)
        cause, mine, conf = _pick([f for f in findings if f.variant != "sigterm"], facts)
        if cause is not None:
            return cause, mine, conf, [f for f in findings if f not in mine], False
        code = facts.returncode
        return "outside_loader", [_Finding("outside_loader", f"the script exited with code {code} without a "
                                           "Python traceback, and nothing came from the DataLoader", "medium")
                                  ], "medium", findings, False
    # the run ended well
    first = facts.loader_errors[0] if facts.loader_errors else None
    if first is not None:
        findings = _episode(facts, first)
        cause, mine, conf = _pick(findings, facts)
        if cause is None:
            fb = _fallback_single(first[0], single)
            if fb is not None:
                cause, mine, conf = "worker_exception", [fb], fb.conf
        if cause is not None:
            for c in facts.loader_errors[1:]:
                others += [f for f in _loader_chain_findings(c, single) if f.cause != cause]
            return cause, mine, conf, [f for f in findings if f not in mine] + others, True
    # no loader error: stderr and statuses alone cannot make a healthy run a failure, except warnings
    # from torch.utils.data itself about a failed worker start (the script caught it before iter() returned)
    warned = [f for f in _stderr_findings(facts) if f.cause == "unpicklable_dataset" and "torch.utils.data" in f.text]
    if warned:
        return "unpicklable_dataset", warned, "medium", [], True
    quiet = [f for f in _worker_findings(facts) if f.variant != "sigterm"]
    # a process of the run that failed, with nothing recorded to say why: the run's own end cannot vouch
    return "ok", [], "medium" if quiet else "high", quiet, False


def _fatal_stack(stderr: str) -> list:
    """``(path, kind)`` of the frames of a faulthandler 'Fatal Python error' dump, if the script printed one."""
    i = stderr.find("Fatal Python error:")
    if i < 0:
        return []
    return [(p, _frame_kind(p)) for p in re.findall(r'File "([^"]+)", line \d+ in ', stderr[i:i + 8000])]


# =========================================================================== summaries
def _summary(cause: str, facts: _Facts, mine: list, recovered: bool) -> str:
    entry = CATALOGUE.get(cause)
    variant = next((f.variant for f in mine if f.variant), None)
    text = entry.summary_for(variant) if entry else "the run failed; nothing recorded says where"
    inner = next((f.detail for f in mine if f.detail), "")
    if cause == "worker_exception" and inner:
        place = "inside a worker" if not _single_process(facts) else "in the main process (num_workers=0)"
        text = f"a Python exception in the Dataset/collate_fn {place}: {inner}"
    elif cause == "native_crash" and variant != "main_process":
        m = re.search(r"killed by (SIG\w+)", " ".join(f.text for f in mine))
        if m:
            text = f"a worker was killed by {m.group(1)} in native code (a crash in C/C++, not a Python error)"
    elif cause == "oom_killed":
        strong = [f for f in mine if f.conf == "high"]
        if any("memory watchdog" in f.text for f in strong):
            text = "a process was SIGKILLed for using too much memory; here the lab's memory watchdog did it"
        elif any("kernel" in f.text for f in strong):
            text = "a process was SIGKILLed for using too much memory: the kernel's OOM killer did it"
        elif strong:
            text = "a process was SIGKILLed for using too much memory (its memory climbed to the limit)"
    elif cause == "worker_exit":
        startup = next((f.detail for f in mine if f.variant == "startup" and f.detail), None)
        if startup:
            text = f"a spawned worker died while starting, before loading any sample: {_short(startup, 120)}"
        elif variant == "sigterm":
            senders = probes.sigterm_senders(facts.env or os.environ)
            text = entry.summary_for("sigterm") + (f"; likely sender here: {senders[0]}" if senders else
                                                   "; nothing in the environment names a scheduler: a person's "
                                                   "kill, a launcher or a service manager")
        else:
            m = re.search(r"code (-?\d+)", inner)
            if m:
                text = (f"a worker exited with code {m.group(1)} without a Python traceback: its own exit "
                        "(sys.exit/os._exit in the Dataset or a library), not a signal")
    elif cause == "fd_limit" and variant == "user_leak" and inner:
        text += f" ({_short(inner, 100)})"
    elif cause == "cuda_in_worker" and not any("worker" in f.text for f in mine) and _single_process(facts):
        text = "CUDA was used by the data-loading code on a machine or build without CUDA"
    elif cause == "outside_loader":
        detail = next((f.detail for f in mine if f.detail), "")
        if detail:
            text = f"the script failed outside data loading ({detail}): the DataLoader is not to blame"
        elif mine:
            text = "the script failed outside data loading: " + _short(mine[0].text, 200)
    elif cause == "hang" and not facts.stall and facts.outcome == "timed_out":
        text = "no progress until the run's time limit: a worker or the main process was stuck"
    if recovered:
        t0 = next((e.t for c in facts.loader_errors for e in c if e.t is not None), None)
        later = [it for it in facts.iters if it.get("num_workers") == 0
                 and (t0 is None or (it.get("t") or 0) >= t0)]
        if later and (t0 is not None or not _single_process(facts)):
            text += " - your script recovered: it caught the error and went on with num_workers=0, then exited 0"
        else:
            text += " - your script recovered: it caught the error and exited 0"
    return text


# =========================================================================== environment probes
def environment_probes(options: Optional[dict] = None, iters: Optional[list] = None,
                       live: bool = False) -> list:
    """Short lines about this machine (and a run's limits) that bear on DataLoader failures."""
    return probes.environment_lines(options, iters, live)


# =========================================================================== explain
def explain(obj) -> Diagnosis:
    """Name the cause of a failed (or successful) DataLoader run.

    ``obj`` is a :class:`~labutils.runner.result.RunResult` or a live exception (``except Exception as e:
    labutils.explain(e)``). Returns a :class:`Diagnosis`.
    """
    if isinstance(obj, BaseException):
        facts = _facts_from_exception(obj)
    elif hasattr(obj, "outcome") and hasattr(obj, "loader_events"):
        if obj.outcome == "unsupported":
            return Diagnosis(UNSUPPORTED, f"the run could not start here: {obj.reason}",
                             [f"runner: {obj.reason}"], [], "high", "run")
        facts = _facts_from_result(obj)
        launch = _torchrun_diagnosis(facts) if facts.outcome == "failed" else None
        if launch is not None:
            return launch
    else:
        raise TypeError(f"explain() takes a RunResult or an exception, not {type(obj).__name__}")

    tree = build_tree(obj, _last_printed_chain, _worker_pids_named, _run_method(facts)) \
        if facts.source == "run" else []
    cause, mine, conf, others, recovered = _decide(facts)
    verdicts = _child_verdicts(facts, tree)
    chosen = next((v for v in verdicts if _child_decides(facts, v, cause)), None)
    if chosen is not None:
        return _child_diagnosis(facts, tree, chosen)
    others = others + [_Finding(v["cause"], f"{_describe_node(v['node'])}: {v['summary']}", "medium")
                       for v in verdicts]
    variant = mine[0].variant if mine and mine[0].variant != "startup" else None
    if variant is None:
        variant = next((f.variant for f in mine if f.variant not in (None, "startup", "no_memory_evidence")), None)
    if cause == "oom_killed":
        variant = "no_memory_evidence" if conf == "low" else None
    evidence = [f.text for f in mine]
    for f in others:
        if f.text in evidence:
            continue
        label = "echo of the failure above" if f.echo else "also seen"
        evidence.append(f"{label}: {f.text}")
    if facts.batches is not None and cause not in ("ok", "outside_loader"):
        evidence.append(f"the DataLoader delivered {_batches(facts.batches)} before it stopped")
    evidence.extend(_status_lines(facts))
    if facts.stall or facts.outcome == "timed_out":
        evidence.extend(_stack_lines(facts))
    ml = facts.memory_limit
    if isinstance(ml, dict) and ml.get("limit"):
        evidence.append(f"memory limit of the run: {ml['limit'] / 2**20:.0f} MiB, enforced by "
                        f"{ml.get('enforced_by', '?')} ({ml.get('mechanism', '')})".rstrip(" ()"))
    evidence.extend(facts.notes)
    try:
        evidence.extend(environment_probes(facts.options, facts.iters, live=facts.source == "exception"))
    except Exception as exc:  # noqa: BLE001 - probes are extra, never fatal
        evidence.append(f"environment probes failed: {exc!r}")
    if cause == "unpicklable_dataset" and facts.live_dataset is not None:
        evidence.extend(_blockers(facts.live_dataset))

    if cause == "ok":
        summary = CATALOGUE["ok"].summary
        if facts.source == "run" and not facts.iters:
            summary = "the script finished; it created no DataLoader iterator"
    else:
        summary = _summary(cause, facts, mine, recovered)
    loose = _unexplained(cause, facts, tree) if facts.source == "run" else []
    if loose and conf == "high":
        conf = "medium"  # a DataLoader error in the record that this cause does not account for
    process = _failing_process(tree, mine) if tree and cause not in ("ok", "outside_loader") else None
    if process is not None and process["role"] == "worker":
        evidence.insert(len(mine), f"failing process: DataLoader worker pid {process['pid']} of the main process"
                        + (f" ({process['name']})" if process["name"] else "")
                        + (f", started by {process['start_method']}" if process["start_method"] else ""))
    return Diagnosis(cause, summary, evidence, _fixes(cause, variant), conf, facts.source, recovered,
                     process=process, tree=[n.to_dict() for n in tree], unexplained=loose)


def _failing_process(tree: list, mine: list) -> Optional[dict]:
    """The process the deciding evidence is about: a worker it names (by pid, or whose own printed error it
    is), else the main process, where the loader ran."""
    texts = " ".join(f.text for f in mine)
    pids = [f.pid for f in mine if f.pid] + [int(p) for p in re.findall(r"\bpid (\d+)", texts)]
    node = next((n for n in tree if n.role == "worker" and n.chain and _short(n.chain[-1].head) in texts), None)
    if node is None:
        node = next((n for pid in pids for n in tree if n.pid == pid), None)
    if node is None:
        node = tree[0]
    return dict(node.to_dict(), depth=0 if node.role == "main" else 1,
                parent=None if node.role == "main" else "main")


# =========================================================================== texts left unexplained
_ANY_LOADER = frozenset(LOADER_CAUSES)
_STARTUP_GUARD = re.compile(r"bootstrapping phase")


def _text_causes(e: _Exc) -> Optional[frozenset]:
    """The causes that account for one DataLoader error text; None when the text is no DataLoader error."""
    head, msg = e.head, (e.message or "").strip()
    m = _WRAPPER.match(msg)
    if m:
        return frozenset({_classify_wrapper(e, m, "", "high").cause})
    if _THREAD_REFUSED.search(msg):
        return frozenset({"fork_refused"})
    if _TIMEOUT.match(head):
        return frozenset({"timeout"})
    km = _KILLED.match(head)
    if km:
        sig = next((n for w, n in _SIGNAL_WORDS.items() if km.group(2).strip().startswith(w)), None)
        causes = {_cause_for_signal(sig)}
        if sig in (9, 15):  # the runner's own stop of a stuck run, or a launcher's SIGTERM
            causes |= {"hang", "timeout", "worker_exit", "oom_killed"}
        return frozenset(causes)
    if _EXITCODE.match(head) or _DIED.match(head) or _PIN_DIED.match(head):
        return _ANY_LOADER  # an echo: any death of a worker or failure of the loader accounts for it
    if _STARTUP_GUARD.search(msg):
        return frozenset({"missing_main_guard"})
    if _MAIN_ATTR.search(msg):
        return frozenset({"main_not_importable", "missing_main_guard"})
    return None


def _record_texts(facts: _Facts, tree: list) -> list:
    """The DataLoader error texts the record holds where a process raised or printed them: the chain that
    ended the script, the chains that escaped the loader, each child's chain, and the last line of each
    traceback a child process printed (stderr lines that are no process's traceback are not counted)."""
    chains = [facts.ended, *facts.loader_errors, *[n.chain for n in tree if n.chain]]
    excs = [e for c in chains for e in c]
    for p in _printed(facts.stderr):
        if p.who != "other" and p.last:
            kind, _, rest = p.last.partition(": ")
            excs.append(_Exc(kind.rsplit(".", 1)[-1], rest or p.last, "", None, "ended"))
    out, seen = [], set()
    for e in excs:
        causes = _text_causes(e)
        text = _short(f"{e.type}: {e.head}", 160)
        if causes is not None and text not in seen:
            seen.add(text)
            out.append((text, causes))
    return out


def _unexplained(cause: str, facts: _Facts, tree: list, survived: Iterable = ()) -> list:
    """Texts of :func:`_record_texts` that ``cause`` does not account for (``survived``: the texts of
    errors the script caught and went on from, listed as such, not unexplained)."""
    skip = set(survived)
    return [t for t, causes in _record_texts(facts, tree) if cause not in causes and t not in skip]


# =========================================================================== a loader in a child process
def _run_method(facts: _Facts) -> Optional[str]:
    """The default start method of the run's processes: set for the run, the lab's default, else the
    platform's."""
    opts = facts.options or {}
    method = opts.get("start_method") or opts.get("lab_default_start_method")
    if not method:
        method = (facts.env or {}).get("LABUTILS_START_METHOD") or probes.default_start_method()
    return method

_CARRIERS = ("ProcessRaisedException", "_RemoteTraceback")


def _child_verdicts(facts: _Facts, tree: list) -> list:
    """The verdict of every child process whose own error names a DataLoader failure."""
    out = []
    for node in tree:
        if node.role != "child" or not node.chain:
            continue
        v = _process_verdict(facts, node, tree)
        if v["cause"] in LOADER_CAUSES:
            out.append(v)
    out.sort(key=lambda v: v["node"].via not in _CARRIERS)
    return out


def _process_verdict(facts: _Facts, node, tree: list) -> dict:
    """Explain one child process from its own chain, like a script of its own (its workers: the pids its
    messages name, with the exit statuses the runner saw)."""
    sub = _Facts(source="run", outcome="failed", returncode=node.exitcode, options=dict(facts.options),
                 env=dict(facts.env), kernel_record=facts.kernel_record, memory_limit=facts.memory_limit,
                 watchdog_kills=list(facts.watchdog_kills))
    sub.ended = node.chain
    codes = {n.pid: n.exitcode for n in tree if n.role == "worker"}
    sub.workers = [_Worker(pid, codes.get(pid)) for pid in _worker_pids_named(node.chain)]
    if not sub.workers and any(_WRAPPER.match(e.head) and "worker process" in e.head for e in node.chain):
        sub.workers = [_Worker(None, None)]  # "Caught X in DataLoader worker process N": it had workers
    cause, mine, conf, others, recovered = _decide(sub)
    line = _TR_WORKER_LINE.search(facts.stderr)
    if line and conf == "low" and cause in ("worker_exit", UNKNOWN):
        # the child saw only the generic death of its worker (under forkserver the fork server, not the
        # child, is the worker's parent); the worker's own C-level line says how it died
        kind = "shm_exhausted" if line.group(1) == "bus error" else "native_crash"
        others = mine + others
        mine = [_Finding(kind, f"stderr: a DataLoader worker printed {line.group(0)!r} before it died (the child "
                         "that owned it saw only the generic 'exited unexpectedly')", "medium")]
        cause, conf = kind, "medium"
    if node.via == "stderr" and not node.exitcode and conf == "high":
        conf = "medium"  # printed on stderr, and no failure of that process recorded to corroborate it
    summary = _summary(cause, sub, mine, recovered) if cause in CATALOGUE else ""
    return {"node": node, "cause": cause, "mine": mine, "conf": conf, "others": others, "sub": sub,
            "summary": summary}


def _child_decides(facts: _Facts, verdict: dict, main_cause: str) -> bool:
    """A child's loader failure is the run's cause when the main process carried it (re-raised its
    traceback), or when the main process itself left no error of its own (an exit code, or 0)."""
    if verdict["node"].via in _CARRIERS:
        return True
    if main_cause in ("ok", UNKNOWN):
        return True
    return not facts.ended and not facts.loader_errors


def _describe_node(node) -> str:
    who = f"child process {node.name!r}" if node.name else "a child process"
    where = [f"pid {node.pid}" if node.pid else (f"one of pids {', '.join(map(str, node.candidates))}"
                                                 if node.candidates else "pid not recorded")]
    if node.start_method:
        where.append(f"started by {node.start_method}")
    return f"{who} ({', '.join(where)})"


_VIA = {"stderr": "its traceback, printed on stderr under 'Process {name}:' by multiprocessing",
        "ProcessRaisedException": "torch.multiprocessing.spawn, which re-raised its traceback in the main process "
                                  "(ProcessRaisedException)",
        "_RemoteTraceback": "concurrent.futures, which re-raised the job's exception in the main process (its "
                            "_RemoteTraceback holds the job's traceback)"}


def _child_diagnosis(facts: _Facts, tree: list, v: dict) -> Diagnosis:
    node, cause, mine, conf = v["node"], v["cause"], v["mine"], v["conf"]
    who = _describe_node(node)
    main_end = (f"the main process exit code {facts.returncode}" if facts.returncode is not None else "")
    summary = f"in {who}, not the main process: {v['summary']}"
    if facts.outcome == "ok":
        summary += "; the script exited 0 anyway (it did not pass on its child's failure)"
    status = "no exit status recorded" if node.exitcode is None else (
        f"killed by {_signame(-node.exitcode)}" if node.exitcode < 0 else f"exit code {node.exitcode}")
    evidence = [f"failing process: {who}, a child of the main process; {status}; its error reached the record "
                f"through {_VIA.get(node.via, node.via).format(name=node.name)}"]
    evidence += [f"{who}: {f.text}" for f in mine]
    evidence += [f"{who}, also seen: {f.text}" for f in v["others"] if f.text not in (m.text for m in mine)]
    evidence += [f"process tree: {_tree_line(n)}" for n in tree]
    if main_end:
        evidence.append(f"main process: {main_end[len('the main process '):]}")
    try:
        evidence.extend(environment_probes(facts.options, facts.iters))
    except Exception as exc:  # noqa: BLE001 - probes are extra, never fatal
        evidence.append(f"environment probes failed: {exc!r}")
    variant = next((f.variant for f in mine if f.variant not in (None, "startup", "no_memory_evidence")), None)
    if cause == "oom_killed":
        variant = "no_memory_evidence" if conf == "low" else None
    process = dict(node.to_dict(), depth=1, parent="main")
    loose = _unexplained(cause, facts, tree)
    if loose and conf == "high":
        conf = "medium"
    return Diagnosis(cause, summary, evidence, _fixes(cause, variant), conf, "run", False,
                     process=process, tree=[n.to_dict() for n in tree], unexplained=loose)


def _tree_line(node) -> str:
    if node.role == "main":
        return "main process" + ("" if node.exitcode is None else f" (exit status {node.exitcode})")
    up = "main" if node.role == "child" else (f"pid {node.parent}" if node.parent else "a process of the run")
    state = "" if node.exitcode is None else f", exit status {node.exitcode}"
    err = f", error {node.chain[0].type}: {_short(node.chain[0].head, 80)}" if node.chain else ""
    name = f" {node.name!r}" if node.name else ""
    return f"{node.role}{name} pid {node.pid or '?'} (parent {up}{state}{err})"


def _status_lines(facts: _Facts) -> list:
    lines = []
    if facts.source == "run":
        if facts.stall:
            lines.append("main process: stopped by the runner after the stall limit")
        elif facts.outcome == "timed_out":
            lines.append("main process: killed by the runner after the time limit")
        elif facts.returncode is not None:
            rc = facts.returncode
            lines.append("main process: " + (f"killed by {_signame(-rc)}" if rc < 0 else f"exit code {rc}"))
    oom, named = kernel_killed(facts) if facts.source == "run" else (set(), False)
    for w in facts.workers:
        if w.exitcode is None:
            state = "exit status not recorded (the run was killed before it could be read)" \
                if facts.source == "run" else "still running or not joined"
        elif w.exitcode < 0:
            state = f"killed by {_signame(-w.exitcode)}"
            if w.pid in oom:
                state += " (by: kernel_oom" + (", named in the kernel log)" if named else ")")
            elif w.watchdog:
                state += " (by: the lab's memory watchdog)"
        else:
            state = f"exit code {w.exitcode}"
        role = "worker" if w.role == "dataloader_worker" else "child process"
        lines.append(f"{role} pid {w.pid}: {state}")
    return lines


def _blockers(dataset) -> list:
    try:
        from ..kit.pickling import find_unpicklable

        found = find_unpicklable(dataset, "dataset")
    except Exception as exc:  # noqa: BLE001
        return [f"find_unpicklable failed: {exc!r}"]
    return [f"cannot pickle: {b.path} ({b.type_name})" for b in found[:5]]


# =========================================================================== torchrun launches
# torchrun (torch.distributed.run) starts one process per rank and, when one fails, stops the others
# with SIGTERM and raises ChildFailedError whose message holds a "Root Cause (first observed failure)"
# block: the rank, its exit code and pid, an error file and a traceback. The rank's own Python traceback
# is on the launch's stderr, each line prefixed with "[rankN]:" (torch >= 2.2; older releases print it
# without the prefix). These functions read both and explain the first failed rank like a script.
_TR_TITLE = re.compile(r"^Root Cause \(first observed failure\):\s*$")
_TR_ENTRY = re.compile(r"^\[(\d+)\]:\s*$")
_TR_FIELD = re.compile(r"^  (time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_TR_RANK = re.compile(r"^(\d+) \(local_rank: (\d+)\)")
_TR_EXIT = re.compile(r"^(-?\d+) \(pid: (\d+)\)\s*(?:\((SIG\w+)\))?")
_TR_RULE = re.compile(r"^(=+|-+)$")
_TR_WORKER_LINE = re.compile(r"ERROR: Unexpected (segmentation fault|floating-point exception|bus error) "
                             r"encountered in worker")
_TR_LINK = {"The above exception was the direct cause of the following exception:": "cause",
            "During handling of the above exception, another exception occurred:": "context"}


def torchrun_failures(text: str) -> list:
    """The failures listed in torchrun's ``ChildFailedError`` text, the root cause first.

    Each is a dict: ``rank``, ``local_rank``, ``exitcode``, ``pid``, ``signal`` (e.g. ``"SIGTERM"`` or
    None), ``error_file`` (None for ``<N/A>``), ``traceback`` (the text torchrun printed: a traceback
    when the script uses ``@record``, else a hint or ``Signal N (SIG) received by PID``), ``host``,
    ``time`` and ``root`` (True for the "first observed failure"). ``[]`` when there is no such block.
    """
    lines = (text or "").replace("\r", "").splitlines()
    out: list = []
    root_section = False
    cur: Optional[dict] = None
    last_field = None
    for line in lines:
        if _TR_TITLE.match(line.strip()):
            root_section, cur = True, None
            continue
        if line.strip() == "Failures:":
            root_section, cur = False, None
            continue
        if _TR_RULE.match(line.strip()) and len(line.strip()) >= 10:
            cur, last_field = None, None
            continue
        m = _TR_ENTRY.match(line)
        if m:
            cur = {"rank": None, "local_rank": None, "exitcode": None, "pid": None, "signal": None,
                   "error_file": None, "traceback": "", "host": None, "time": None, "root": root_section}
            out.append(cur)
            last_field = None
            continue
        if cur is None:
            continue
        m = _TR_FIELD.match(line)
        if m:
            name, value = m.group(1), m.group(2).rstrip()
            last_field = name
            if name == "rank":
                r = _TR_RANK.match(value)
                if r:
                    cur["rank"], cur["local_rank"] = int(r.group(1)), int(r.group(2))
            elif name == "exitcode":
                e = _TR_EXIT.match(value)
                if e:
                    cur["exitcode"], cur["pid"] = int(e.group(1)), int(e.group(2))
                    cur["signal"] = e.group(3)
            elif name == "error_file":
                cur["error_file"] = None if value in ("<N/A>", "") else value
            elif name == "traceback":
                cur["traceback"] = value
            else:
                cur[name] = value
        elif last_field == "traceback":  # @record: the rank's traceback, indented by two more spaces
            cur["traceback"] += "\n" + (line[2:] if line.startswith("  ") else line)
    out = [f for f in out if f["rank"] is not None]
    out.sort(key=lambda f: not f["root"])
    return out


def rank_output(stderr: str, rank: int) -> str:
    """The lines rank ``rank`` printed on a torchrun launch's stderr, without their ``[rankN]:`` prefix."""
    prefix = f"[rank{rank}]:"
    out = []
    for line in (stderr or "").replace("\r", "").splitlines():
        if line.startswith(prefix):
            rest = line[len(prefix):]
            out.append(rest[1:] if rest.startswith(" ") else rest)
    return "\n".join(out)


def _last_printed_chain(text: str) -> list:
    """The last exception chain Python printed in ``text``, as ``_Exc`` (the one that ended it first)."""
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.strip() == "Traceback (most recent call last):"]
    if not starts:
        return []
    first = starts[-1]
    for i in reversed(starts[:-1]):  # walk back over tracebacks joined by "The above exception ..."
        if not any(ln.strip() in _TR_LINK for ln in lines[i:first]):
            break
        first = i
    segments, links, cur = [], [], None
    for ln in lines[first:]:
        if ln.strip() == "Traceback (most recent call last):":
            cur = {"frames": [], "message": []}
            segments.append(cur)
        elif ln.strip() in _TR_LINK:
            links.append(_TR_LINK[ln.strip()])
            cur = None
        elif cur is not None:
            if not cur["message"] and (ln.startswith((" ", "\t")) or not ln.strip()):
                cur["frames"].append(ln)
            else:
                cur["message"].append(ln)
    chain = []
    for seg in segments:
        msg = "\n".join(seg["message"]).strip()
        head = msg.splitlines()[0] if msg else ""
        kind, sep, rest = head.partition(":")
        kind = kind.strip().rsplit(".", 1)[-1]
        if not sep and re.fullmatch(r"\w+", head.strip()):
            kind, rest = head.strip().rsplit(".", 1)[-1], ""
        elif not kind or " " in kind:
            kind, rest = "?", head
        message = "\n".join([rest.strip(), *msg.splitlines()[1:]]).strip()
        tb = "\n".join(["Traceback (most recent call last):", *seg["frames"], msg])
        chain.append(_Exc(kind, message, tb, None, "ended"))
    chain.reverse()  # printed oldest first; the one that ended the rank is first here
    for n in range(1, len(chain)):
        chain[n].link = links[len(chain) - 1 - n] if len(chain) - 1 - n < len(links) else "cause"
    return chain


def _worker_pids_named(chain: list) -> list:
    pids: list = []
    for e in chain:
        for regex in (_KILLED, _EXITCODE):
            m = regex.match(e.head)
            if m and int(m.group(1)) not in pids:
                pids.append(int(m.group(1)))
        m = _DIED.match(e.head)
        if m:
            pids += [int(p) for p in m.group(1).replace(" ", "").split(",") if p and int(p) not in pids]
    return pids


# a rank that failed because another rank died: the collective's connection broke (gloo, NCCL)
_PEER_ECHO = re.compile(r"Connection closed by peer|Connection reset by peer|remote worker crash|"
                        r"Broken pipe|NCCL communicator was aborted|Watchdog caught collective operation timeout|"
                        r"recvBytes|Socket Timeout", re.I)


def _rank_verdict(facts: _Facts, failure: dict) -> dict:
    """Explain one failed rank from its own printed traceback, like a script of its own."""
    rank, code = failure["rank"], failure["exitcode"]
    own = rank_output(facts.stderr, rank)
    origin = f"rank {rank}'s own traceback on stderr ([rank{rank}]: lines)"
    chain = _last_printed_chain(own) if own else []
    if not chain and "Traceback (most recent call last):" in failure["traceback"]:
        chain, origin = _last_printed_chain(failure["traceback"]), "the traceback in torchrun's failure block"
    if not chain and not own:  # torch < 2.2 prints rank lines without a prefix: the whole stderr, less sure
        text = facts.stderr
        cut = text.rfind("ChildFailedError")
        if cut >= 0:  # leave out the launcher's own traceback
            text = text[:max(text.rfind("Traceback (most recent call last):", 0, cut), 0)]
        if "Original exception was:" in text:  # the rank's excepthook failed; Python printed the original
            text = text[text.rfind("Original exception was:"):]
        chain = _last_printed_chain(text)
        origin = "the last traceback on the launch's stderr (no [rankN]: prefixes to tell ranks apart)"
    sub = _Facts(source="run", outcome="failed", returncode=code, stderr=own or facts.stderr,
                 options=dict(facts.options), env=dict(facts.env), kernel_record=facts.kernel_record)
    sub.main_signal = -code if isinstance(code, int) and code < 0 else None
    sub.ended = chain
    sub.workers = [_Worker(pid, None) for pid in _worker_pids_named(chain)]
    if not sub.workers and any(_WRAPPER.match(e.head) and "worker process" in e.head for e in chain):
        sub.workers = [_Worker(None, None)]  # "Caught X in DataLoader worker process N": it had workers
    cause, mine, conf, others, recovered = _decide(sub)
    if not chain and sub.main_signal is None:
        cause, conf = UNKNOWN, "low"
    line = _TR_WORKER_LINE.search(facts.stderr)  # a worker's own line has no [rankN]: prefix
    if line and conf == "low" and cause in ("worker_exit", UNKNOWN) and (chain or sub.main_signal):
        # the rank saw only an echo of a worker's death (a fetch from its gone socket); the worker's own
        # C-level line says how it died
        kind = "shm_exhausted" if line.group(1) == "bus error" else "native_crash"
        mine = [_Finding(kind, f"stderr: a DataLoader worker of the launch printed {line.group(0)!r} before it "
                         "died (under forkserver/spawn a rank may not learn its worker's signal)", "medium")]
        others = others + [_Finding(cause, "the rank's own exception was an echo of that death", "low", echo=True)]
        cause, conf = kind, "medium"
    echo = bool(chain) and cause == "outside_loader" and bool(_PEER_ECHO.search(chain[0].message))
    stopped = failure["signal"] == "SIGTERM" and not chain
    return {"failure": failure, "cause": cause, "mine": mine, "conf": conf, "others": others,
            "recovered": recovered, "chain": chain, "origin": origin, "sub": sub, "echo": echo or stopped}


def _torchrun_diagnosis(facts: _Facts) -> Optional[Diagnosis]:
    """The diagnosis of a failed torchrun launch: the first failed rank explained as its own script.

    torchrun's root cause is the first failure it *observed*; without ``@record`` two ranks that exit
    in the same instant are ordered arbitrarily, and a peer whose collective broke because the other rank
    died can be named. Such an echo (a gloo/NCCL connection error outside data loading, or a rank stopped
    with SIGTERM) is passed over for a failed rank with a cause of its own, and the evidence says so.
    """
    text = "\n".join(e.message for e in facts.ended if e.type == "ChildFailedError")
    failures = torchrun_failures(text or facts.stderr)
    if not failures or not failures[0]["root"]:
        return None
    verdicts = [_rank_verdict(facts, f) for f in failures]
    chosen = next((v for v in verdicts if not v["echo"]), verdicts[0])
    root = chosen["failure"]
    rank, code = root["rank"], root["exitcode"]
    cause, mine, conf, sub = chosen["cause"], chosen["mine"], chosen["conf"], chosen["sub"]
    where = f"rank {rank} (local rank {root['local_rank']}, pid {root['pid']})"
    how = f"killed by {root['signal'] or _signame(-code)}" if isinstance(code, int) and code < 0 \
        else f"exit code {code}"
    head = f"torchrun: {where} failed first ({how})"
    if cause in CATALOGUE and cause != "ok":
        summary = f"{head}: {_summary(cause, sub, mine, chosen['recovered'])}"
    else:
        summary = f"{head}; its own output names no cause"
        cause = UNKNOWN if cause == "ok" else cause
    first = failures[0]
    evidence = [f"torchrun's Root Cause (first observed failure): rank {first['rank']}, local_rank "
                f"{first['local_rank']}, exitcode {first['exitcode']} (pid {first['pid']}), error_file "
                f"{first['error_file'] or '<N/A>'}"]
    if root is not first:
        evidence.append(f"rank {first['rank']}'s failure is an echo (its collective lost the peer that died: "
                        f"{_short(verdicts[0]['chain'][0].head if verdicts[0]['chain'] else 'stopped', 120)}); "
                        f"rank {rank} failed with a cause of its own. torchrun orders failures by the time it "
                        "observed them; @record (torch.distributed.elastic.multiprocessing.errors) makes each "
                        "rank write its error with its own timestamp")
    evidence += [f"rank {rank}: {f.text}" for f in mine]
    evidence += [f"rank {rank}, also seen: {f.text}" for f in chosen["others"] if f.text not in (m.text for m in mine)]
    evidence.append(f"read from {chosen['origin']}" if chosen["chain"] else f"rank {rank} printed no Python traceback")
    for v in verdicts:
        f = v["failure"]
        if f is root:
            continue
        state = f"killed by {f['signal']}" if f["signal"] else f"exit code {f['exitcode']}"
        note = " (torchrun stopped it after the first failure)" if f["signal"] == "SIGTERM" else \
            (" (an echo: its collective lost a peer)" if v["echo"] else f" ({v['cause']})")
        evidence.append(f"rank {f['rank']} (local rank {f['local_rank']}, pid {f['pid']}): {state}{note}")
    evidence.append("launcher (torchrun): " + (f"exit code {facts.returncode}" if facts.returncode is not None
                                                else "no exit code recorded"))
    try:
        evidence.extend(environment_probes(facts.options, facts.iters))
    except Exception as exc:  # noqa: BLE001 - probes are extra, never fatal
        evidence.append(f"environment probes failed: {exc!r}")
    variant = next((f.variant for f in mine if f.variant not in (None, "startup")), None)
    launch = {"launcher": "torchrun", "rank": rank, "local_rank": root["local_rank"], "exitcode": code,
              "pid": root["pid"], "signal": root["signal"], "error_file": root["error_file"],
              "root_cause_rank": first["rank"], "failures": failures}
    return Diagnosis(cause, summary, evidence, _fixes(cause, variant) if cause in CATALOGUE else [], conf,
                     "run", chosen["recovered"], launch)
