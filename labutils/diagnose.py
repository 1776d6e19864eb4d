"""Name the cause of a DataLoader failure from the evidence it left.

``explain(obj)`` takes a :class:`~labutils.result.RunResult` (an isolated run: exception chains, the
exit code or signal of every worker, worker stderr, the run's limits) or a live exception caught in
the learner's own kernel (``except RuntimeError as e: labutils.explain(e)``: the exception chain, the
DataLoader iterator found in its traceback, and this process's environment). It returns a
:class:`Diagnosis`: one cause id from :data:`CAUSES`, a one-line summary, the evidence used, and the
fixes, each naming the notebook that demonstrates it.

How a cause is chosen
---------------------
Every piece of evidence becomes a *finding* ``(cause, strength, text)``. Structured evidence comes
first: the exception types and the messages PyTorch itself writes (``Caught X in DataLoader worker
process N``, ``DataLoader worker (pid N) is killed by signal``, ``DataLoader timed out``), worker exit
codes and signals, the lab's watchdog kills, the run's outcome. Worker stderr lines are evidence too,
except lines that only repeat an exception already recorded (so a message the user wrote cannot pose
as a crash report). The cause is the finding highest in :data:`PRECEDENCE`: specific resource
exhaustion (shm, fds) beats the generic symptoms it produces; start-up failures of spawn children
beat the exit code or the hang they cause; a named Python exception beats a vague timeout; a hang
(the runner's time limit) is the last resort.
"""

from __future__ import annotations

import html
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Optional

__all__ = ["CAUSES", "PRECEDENCE", "Diagnosis", "Fix", "NOTEBOOKS", "environment_probes", "explain"]

#: The fixed vocabulary (DESIGN.md). ``unsupported`` (the run could not start here) and ``unknown``
#: (the run failed, but not in a DataLoader) are outside it: they name no loader failure.
CAUSES = ("ok", "worker_exception", "unpicklable_dataset", "main_not_importable", "missing_main_guard",
          "native_crash", "oom_killed", "shm_exhausted", "fd_limit", "worker_exit", "timeout", "hang",
          "cuda_in_worker")
UNSUPPORTED = "unsupported"
UNKNOWN = "unknown"

#: First found wins. Resource exhaustion is named before the symptoms it causes (an exception in a
#: worker, a killed worker, a hang); spawn start-up failures before the exit code or hang they cause.
PRECEDENCE = ("shm_exhausted", "fd_limit", "cuda_in_worker", "missing_main_guard", "main_not_importable",
              "unpicklable_dataset", "native_crash", "oom_killed", "worker_exception", "timeout",
              "worker_exit", "hang", UNKNOWN)

NOTEBOOKS = {
    "01": "01_read_the_error", "02": "02_spawn_and_pickling", "03": "03_corrupt_data",
    "04": "04_memory_and_oom", "05": "05_shared_memory", "06": "06_file_descriptors",
    "07": "07_hangs_and_timeouts",
}


# =========================================================================== public result types
@dataclass
class Fix:
    """One way out, and the notebook (stem, e.g. ``04_memory_and_oom``) that demonstrates it."""

    text: str
    notebook: str

    @property
    def path(self) -> str:
        return f"notebooks/{self.notebook}.ipynb"

    def __str__(self) -> str:
        return f"{self.text}  [{self.path}]"


@dataclass
class Diagnosis:
    """The cause of a run or exception, with the evidence used and the fixes.

    ``cause`` is one of :data:`CAUSES` (or ``unsupported`` / ``unknown``); ``confidence`` is
    ``"high"`` (structured evidence: exit codes, signals, PyTorch's own messages), ``"medium"``
    (stderr lines or message text only) or ``"low"`` (a fallback, e.g. a bare hang);
    ``source`` is ``"run"`` for a RunResult and ``"exception"`` for a live exception.
    """

    cause: str
    summary: str
    evidence: list = field(default_factory=list)
    fixes: list = field(default_factory=list)
    confidence: str = "high"
    source: str = "run"

    @property
    def ok(self) -> bool:
        return self.cause == "ok"

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        lines = [f"cause: {self.cause} ({self.confidence} confidence)", f"  {self.summary}"]
        if self.evidence:
            lines.append("evidence:")
            lines.extend(f"  - {e}" for e in self.evidence)
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


# =========================================================================== fixes per cause
_FIXES = {
    "worker_exception": [
        ("Read the inner exception after 'Original Traceback' (it names the file and line in your "
         "Dataset or collate_fn); rerun with num_workers=0 to debug it in-process", "01"),
        ("If some samples are bad, skip and record them (labutils.fixes.QuarantineDataset + collate_skip) "
         "instead of returning zeros or letting one file stop the epoch", "03"),
    ],
    "unpicklable_dataset": [
        ("Find the attribute that cannot be pickled: labutils.find_unpicklable(dataset)", "02"),
        ("Open files, connections and locks lazily in each worker (labutils.fixes.LazyFile / "
         "PerWorkerResource), not in __init__; keep collate_fn/worker_init_fn module-level functions, "
         "not lambdas or local functions", "02"),
        ("On Linux, multiprocessing_context='fork' avoids pickling (fork is unsafe with threads and CUDA)",
         "02"),
    ],
    "main_not_importable": [
        ("Move the Dataset class (and collate_fn, worker_init_fn) into a .py module and import it: "
         "spawn/forkserver workers import classes by name and a notebook's __main__ has no file", "02"),
        ("Run the training code as a script file (python train.py), not pasted into python -c or stdin",
         "02"),
        ("On Linux, multiprocessing_context='fork' needs no import of __main__", "02"),
    ],
    "missing_main_guard": [
        ("Put the code that builds and iterates the DataLoader under `if __name__ == \"__main__\":` - "
         "spawn/forkserver workers re-import your script and must not start workers themselves", "02"),
    ],
    "native_crash": [
        ("A C extension crashed in the worker (decoder, OpenCV, a corrupt file): enable faulthandler in "
         "workers (labutils.fixes.worker_init_seed_and_faulthandler) to see which sample and call", "03"),
        ("Find and quarantine the file that crashes the decoder; validate data up front; update the "
         "native library", "03"),
        ("Rerun with num_workers=0 to get the crash in the main process under a debugger", "01"),
    ],
    "oom_killed": [
        ("Reduce the memory each worker holds: fewer workers, smaller batch_size or prefetch_factor, "
         "no caches that grow per sample", "04"),
        ("Avoid copy-on-read: keep sample lists/metadata in numpy arrays or one byte buffer instead of "
         "Python lists/dicts, and measure worker USS/PSS (not RSS)", "04"),
        ("Check the container or cgroup memory limit (dmesg shows the kernel OOM killer's log)", "04"),
    ],
    "shm_exhausted": [
        ("Give /dev/shm more room (docker run --shm-size=2g or --ipc=host; Kubernetes: an emptyDir "
         "with medium: Memory on /dev/shm)", "05"),
        ("Keep batch bytes x prefetch_factor x num_workers under the free /dev/shm "
         "(labutils.doctor shows the budget)", "05"),
    ],
    "fd_limit": [
        ("Raise the soft open-files limit (ulimit -n 65536, or resource.setrlimit at start-up)", "06"),
        ("torch.multiprocessing.set_sharing_strategy('file_system') needs one fd per batch in flight, "
         "not one per tensor kept alive", "06"),
        ("Do not keep every batch alive: store what you need (.item(), .clone() of small tensors, "
         "numpy copies) and let the batches go", "06"),
    ],
    "worker_exit": [
        ("Something in the worker called sys.exit()/os._exit() or a library exited: rerun with "
         "num_workers=0 to see it in-process, and read the worker stderr", "01"),
        ("Enable faulthandler in workers (labutils.fixes.make_worker_init) to see the last stack", "07"),
    ],
    "timeout": [
        ("A worker did not deliver a batch in time: dump the workers' stacks (labutils.fixes."
         "make_worker_init(dump_after=...)) to see where they wait (lock, network, a deadlock after fork)",
         "07"),
        ("Raise DataLoader(timeout=...) only if loading is legitimately slow; otherwise fix the stuck "
         "call (locks or threads created before fork, e.g. OpenCV/OpenMP)", "07"),
    ],
    "hang": [
        ("Set DataLoader(timeout=...) so a stuck worker raises instead of hanging forever", "07"),
        ("Dump the stacks of the stuck processes (faulthandler, py-spy dump) to see what they wait on",
         "07"),
        ("Bound the job with a watchdog / retry (labutils.fixes.ResilientLoader)", "07"),
    ],
    "cuda_in_worker": [
        ("Keep workers on the CPU: return CPU tensors from __getitem__ and move each batch to the device "
         "in the training loop (pin_memory=True, batch.to(device, non_blocking=True))", "02"),
        ("Pick the device once: device = 'cuda' if torch.cuda.is_available() else 'cpu'", "02"),
        ("If workers must touch CUDA, use multiprocessing_context='spawn' (CUDA cannot be used in a "
         "forked child)", "02"),
    ],
    UNKNOWN: [
        ("Read the exception above: it did not come from a DataLoader worker", "01"),
    ],
}


def _fixes(cause: str) -> list:
    return [Fix(text, NOTEBOOKS[nb]) for text, nb in _FIXES.get(cause, [])]


# =========================================================================== evidence model
@dataclass
class _Exc:
    type: str
    message: str
    traceback: str = ""
    link: Optional[str] = None
    origin: str = "main"  # "main" (ended the script), "loader" (escaped next(), maybe caught), "live"


@dataclass
class _Worker:
    pid: Optional[int]
    exitcode: Optional[int]
    role: str = "dataloader_worker"
    watchdog: bool = False


@dataclass
class _Finding:
    cause: str
    text: str
    strong: bool = True
    detail: str = ""  # e.g. the inner worker error, for the summary


@dataclass
class _Facts:
    source: str
    chains: list = field(default_factory=list)  # list of list[_Exc]
    workers: list = field(default_factory=list)  # list[_Worker]
    stderr: str = ""
    outcome: Optional[str] = None
    returncode: Optional[int] = None
    main_signal: Optional[int] = None
    watchdog_kills: list = field(default_factory=list)
    iters: list = field(default_factory=list)  # loader "iter" events
    options: dict = field(default_factory=dict)
    reason: Optional[str] = None
    notes: list = field(default_factory=list)  # extra evidence lines gathered on the way
    live_dataset: Any = None
    escaped: list = field(default_factory=list)  # first exception of every chain that escaped next()
    live_findings: list = field(default_factory=list)  # inferred from the live iterator and __main__


# --------------------------------------------------------------------------- message patterns
_WRAPPER = re.compile(r"^\W?Caught (\w[\w.]*) in (DataLoader worker process (\d+)|pin memory thread[^.]*)")
_TIMEOUT = re.compile(r"^DataLoader timed out after ([\d.]+) seconds")
_RACE_TYPES = {"FileNotFoundError", "ConnectionResetError", "ConnectionRefusedError", "EOFError",
               "BrokenPipeError"}
_RACE_FRAMES = re.compile(r"rebuild_storage_fd|recvfds|resource_sharer|multiprocessing/reduction\.py")
_DIED = re.compile(r"^DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")
_KILLED = re.compile(r"^DataLoader worker \(pid (\d+)\) is killed by signal: ([^.]+)")
_EXITCODE = re.compile(r"^DataLoader worker \(pid (\d+)\) exited unexpectedly with exit code (-?\d+)")
_SHM = re.compile(r"unable to (allocate|open|write to|mmap)[^\n]*shared memory|"
                  r"No space left on device[^\n]*(torch_|/dev/shm)|(torch_|/dev/shm)[^\n]*No space left on device|"
                  r"Unexpected bus error encountered in worker|out of shared memory", re.I)
_FD = re.compile(r"Too many open files|\[Errno 24\]|received 0 items of ancdata|EMFILE")
_CUDA = re.compile(r"Torch not compiled with CUDA enabled|re-initialize CUDA in forked subprocess|"
                   r"CUDA error|Found no NVIDIA driver|No CUDA GPUs are available|"
                   r"CUDA driver initialization failed|cudaGetDeviceCount")
_GUARD = re.compile(r"attempt has been made to start a new process before the\s+current process has "
                    r"finished its bootstrapping phase")
_MAIN_ATTR = re.compile(r"Can't get attribute '([^']+)' on <module '(__main__|__mp_main__)'")
_STDIN_MAIN = re.compile(r"No such file or directory: '[^']*<stdin>'")
_PICKLE = re.compile(r"cannot pickle|can't pickle|Can't get local object|pickle error|"
                     r"attribute lookup .* failed|is not picklable|PicklingError", re.I)
_SEGV_LINE = re.compile(r"Unexpected (segmentation fault|floating-point exception) encountered in worker")
# Only these exception types can carry a resource or CUDA failure out of a worker; a ValueError that
# merely mentions "Too many open files" is the user's own exception.
_RESOURCE_TYPES = {"RuntimeError", "OSError", "PermissionError", "BlockingIOError", "ConnectionError",
                   "FileNotFoundError", "MemoryError"}
_CUDA_TYPES = {"AssertionError", "RuntimeError", "AcceleratorError", "CudaError", "DeferredCudaCallError",
               "OutOfMemoryError"}
_SIGNAL_WORDS = {"Killed": 9, "Segmentation fault": 11, "Bus error": 7, "Aborted": 6,
                 "Floating point exception": 8, "Illegal instruction": 4, "Terminated": 15}
_NATIVE_SIGNALS = {11: "SIGSEGV", 8: "SIGFPE", 6: "SIGABRT", 4: "SIGILL", 5: "SIGTRAP", 31: "SIGSYS"}
_SIG_NAMES = {9: "SIGKILL", 7: "SIGBUS", 15: "SIGTERM", 2: "SIGINT", 1: "SIGHUP", **_NATIVE_SIGNALS}


def _signame(num: int) -> str:
    return _SIG_NAMES.get(num, f"signal {num}")


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _inner_line(message: str) -> str:
    """The last ``Type: message`` line of the worker traceback quoted in a ``Caught X`` message."""
    _, sep, tail = message.partition("Original Traceback (most recent call last):")
    body = tail if sep else message
    last = ""
    for line in body.splitlines():
        if line and not line[0].isspace() and not line.startswith("Traceback ("):
            last = line
    return last.strip() or message.splitlines()[0]


# =========================================================================== gathering
def _facts_from_result(result) -> _Facts:
    facts = _Facts(source="run", outcome=result.outcome, returncode=result.returncode,
                   main_signal=result.signal, stderr=result.stderr or "",
                   watchdog_kills=list(result.watchdog_kills or []), options=dict(result.options or {}),
                   reason=result.reason)
    main_chain = [_Exc(e.type, e.message, e.traceback, e.link, "main") for e in result.exceptions]
    seen_msgs = set()
    if main_chain:
        facts.chains.append(main_chain)
        seen_msgs = {(e.type, e.message) for e in main_chain}
    for chain in result.loader_errors:
        excs = [_Exc(e.type, e.message, e.traceback, e.link, "loader") for e in chain]
        if excs:
            facts.escaped.append(excs[0])
        if excs and {(e.type, e.message) for e in excs} <= seen_msgs:
            continue  # the same chain that ended the script
        facts.chains.append(excs)
    for w in result.workers:
        facts.workers.append(_Worker(w.pid, w.exitcode, w.role, bool(w.killed_by_watchdog)))
    facts.iters = [ev for ev in result.loader_events if ev.get("event") == "iter"]
    return facts


def _chain_of(exc: BaseException) -> list:
    import traceback as tb_mod

    out, seen, link = [], set(), None
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        try:
            tb = "".join(tb_mod.format_exception(type(exc), exc, exc.__traceback__, chain=False))
        except Exception:  # noqa: BLE001 - a broken __str__ must not stop the diagnosis
            tb = ""
        try:
            msg = str(exc)
        except Exception:  # noqa: BLE001
            msg = repr(exc)
        out.append((exc, _Exc(type(exc).__qualname__, msg, tb, link, "live")))
        if exc.__cause__ is not None:
            exc, link = exc.__cause__, "cause"
        elif exc.__context__ is not None and not exc.__suppress_context__:
            exc, link = exc.__context__, "context"
        else:
            exc = None
    return out


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


def _main_file_ok(main) -> bool:
    path = getattr(main, "__file__", None)
    return bool(path) and os.path.isfile(path)


def _facts_from_exception(exc: BaseException) -> _Facts:
    facts = _Facts(source="exception", outcome="failed")
    pairs = _chain_of(exc)
    facts.chains.append([e for _, e in pairs])
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
            import multiprocessing

            method = (multiprocessing.get_start_method(allow_none=True)
                      or multiprocessing.get_all_start_methods()[0])
        ds = getattr(it, "_dataset", None)
        facts.live_dataset = ds
        main = sys.modules.get("__main__")
        ds_module = type(ds).__module__ if ds is not None else None
        codes = [w.exitcode for w in facts.workers]
        if (method in ("spawn", "forkserver") and ds_module == "__main__"
                and not _main_file_ok(main) and any(c == 1 for c in codes)):
            facts.live_findings.append(_Finding(
                "main_not_importable", f"workers exited with code 1 at start-up under {method}, and the "
                f"dataset class {type(ds).__qualname__} lives in this __main__, which has no file to import "
                "it from", strong=False))
        facts.iters.append({"event": "iter", "num_workers": getattr(it, "_num_workers", None),
                            "timeout": getattr(it, "_timeout", None), "start_method": method,
                            "dataset": type(ds).__module__ + "." + type(ds).__qualname__ if ds is not None
                            else None})
    return facts


# =========================================================================== rules
def _classify_exception(e: _Exc, where: str) -> list:
    """Findings from one exception of a chain. ``where`` describes the chain for evidence lines."""
    msg = e.message or ""
    head = msg.strip().splitlines()[0] if msg.strip() else ""
    found = []
    m = _WRAPPER.match(msg.strip())
    if m:
        inner_type, place = m.group(1), m.group(2)
        inner = _inner_line(msg)
        said = f"{where}: {e.type} 'Caught {inner_type} in {place}' - inner error: {_short(inner)}"
        if inner_type in _RESOURCE_TYPES and _SHM.search(inner):
            found.append(_Finding("shm_exhausted", said + " (a shared-memory allocation failed in the worker)"))
        elif inner_type in _RESOURCE_TYPES and _FD.search(inner):
            found.append(_Finding("fd_limit", said + " (the worker ran out of file descriptors)"))
        elif inner_type in _CUDA_TYPES and _CUDA.search(inner):
            found.append(_Finding("cuda_in_worker", said + " (CUDA used inside a DataLoader worker)"))
        elif _MAIN_ATTR.search(inner):
            found.append(_Finding("main_not_importable", said))
        else:
            found.append(_Finding("worker_exception", said, detail=_short(inner, 120)))
        return found
    if _TIMEOUT.match(head):
        found.append(_Finding("timeout", f"{where}: {e.type}: {_short(head)}"))
        return found
    if e.type in _RACE_TYPES and _RACE_FRAMES.search(e.traceback or ""):
        found.append(_Finding("_died", f"{where}: {e.type}: {_short(head)} - raised while receiving a batch "
                              "from a worker that had already exited (its end of the fd-passing socket is "
                              "gone): a worker death seen from the other side; its exit status says why"))
        return found
    m = _KILLED.match(head)
    if m:
        word = m.group(2).strip()
        sig = next((n for w, n in _SIGNAL_WORDS.items() if word.startswith(w)), None)
        text = f"{where}: PyTorch reports worker pid {m.group(1)} killed by signal: {word}"
        found.append(_Finding(_cause_for_signal(sig) if sig else "worker_exit", text))
        return found
    m = _EXITCODE.match(head)
    if m:
        found.append(_Finding("worker_exit", f"{where}: PyTorch reports worker pid {m.group(1)} exited with "
                              f"exit code {m.group(2)}", strong=False))
        return found
    if _DIED.match(head):
        found.append(_Finding("_died", f"{where}: {e.type}: {_short(head)} (the generic message; the reason "
                              "is in the chain below it and in the worker exit status)"))
        return found
    if _GUARD.search(msg):
        found.append(_Finding("missing_main_guard", f"{where}: {e.type}: {_short(head)}"))
    elif _MAIN_ATTR.search(msg):
        found.append(_Finding("main_not_importable", f"{where}: {e.type}: {_short(head)}"))
    elif e.type in _RESOURCE_TYPES and _SHM.search(msg):
        found.append(_Finding("shm_exhausted", f"{where}: {e.type}: {_short(head)}"))
    elif e.type in _RESOURCE_TYPES and _FD.search(msg):
        found.append(_Finding("fd_limit", f"{where}: {e.type}: {_short(head)}"))
    elif e.type in _CUDA_TYPES and _CUDA.search(msg):
        found.append(_Finding("cuda_in_worker", f"{where}: {e.type}: {_short(head)}"))
    elif (e.type in ("TypeError", "PicklingError", "AttributeError", "PickleError")
          and _PICKLE.search(msg)
          and (not e.traceback or re.search(r"multiprocessing|reduction|popen_|pickle", e.traceback))):
        found.append(_Finding("unpicklable_dataset", f"{where}: {e.type}: {_short(head)} (raised while "
                              "sending the dataset/collate_fn/worker_init_fn to a new worker)"))
    return found


def _cause_for_signal(sig: int) -> str:
    if sig == 9:
        return "oom_killed"
    if sig == 7:
        return "shm_exhausted"
    if sig in _NATIVE_SIGNALS:
        return "native_crash"
    return "worker_exit"


def _echoes(facts: _Facts) -> str:
    return "\n".join(e.message + "\n" + e.traceback for chain in facts.chains for e in chain)


def _stderr_findings(facts: _Facts) -> list:
    """Findings from stderr lines that do not merely repeat a recorded exception."""
    if not facts.stderr:
        return []
    echo = _echoes(facts)
    found, seen = [], set()
    rules = [
        (_SEGV_LINE, "native_crash", "a worker reports a fatal signal"),
        (re.compile(r"Unexpected bus error encountered in worker"), "shm_exhausted", "a worker got SIGBUS"),
        (_GUARD, "missing_main_guard", "a spawned child re-ran the script's top level and tried to start "
                                       "workers itself"),
        (_MAIN_ATTR, "main_not_importable", "a spawned worker could not find a class of __main__"),
        (_STDIN_MAIN, "main_not_importable", "a spawned worker could not re-import __main__ (stdin)"),
        (re.compile(r"Got pickle error when attempting to start a worker Process"), "unpicklable_dataset",
         "PyTorch warns it could not pickle the worker arguments"),
        (re.compile(r"^\w*(TypeError|PicklingError|AttributeError): .*(cannot pickle|Can't pickle|"
                    r"Can't get local object)"), "unpicklable_dataset", "a pickling error"),
        (_FD, "fd_limit", "a process ran out of file descriptors"),
        (_SHM, "shm_exhausted", "a shared-memory allocation failed"),
        (_CUDA, "cuda_in_worker", "a CUDA error"),
    ]
    text = facts.stderr.replace("\r", "")
    # the guard message spans two lines in CPython's text: join them for the search
    flat = re.sub(r"\n\s+", " ", text)
    for rx, cause, what in rules:
        for m in rx.finditer(flat if rx is _GUARD else text):
            line = _line_at(flat if rx is _GUARD else text, m.start())
            if len(line) >= 12 and line in echo:
                continue  # repeats an exception we already read (maybe the user's own message)
            key = (cause, line)
            if key in seen:
                continue
            seen.add(key)
            found.append(_Finding(cause, f"stderr: {what}: {_short(line)}", strong=False))
            break
    return found


def _tracebacks(text: str) -> list:
    """``(body, last_line)`` of every Python traceback printed in ``text``."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip().startswith("Traceback (most recent call last):"):
            indent = len(lines[i]) - len(lines[i].lstrip())
            body = []
            j = i + 1
            while j < len(lines) and (len(lines[j]) - len(lines[j].lstrip()) > indent or not lines[j].strip()):
                body.append(lines[j])
                j += 1
            last = lines[j].strip() if j < len(lines) else ""
            out.append(("\n".join(body), last))
            i = j + 1
        else:
            i += 1
    return out


def _startup_failures(facts: _Facts) -> list:
    """Error lines of spawn/forkserver children that died while starting (before running any sample)."""
    found = []
    for body, last in _tracebacks(facts.stderr):
        if re.search(r"multiprocessing[/\\](spawn|forkserver)\.py", body) and "_main" in body and last:
            if last not in found:
                found.append(last)
    return found


def _line_at(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start: end if end >= 0 else len(text)].strip()


def _worker_findings(facts: _Facts) -> list:
    found = []
    watchdog_pids = {k.get("pid") for k in facts.watchdog_kills}
    for w in facts.workers:
        if w.exitcode is None or w.exitcode == 0:
            continue
        who = "DataLoader worker" if w.role == "dataloader_worker" else "child process"
        if w.exitcode < 0:
            sig = -w.exitcode
            text = f"{who} pid {w.pid}: killed by {_signame(sig)}"
            if sig == 9 and (w.watchdog or w.pid in watchdog_pids):
                text += " - by the lab's memory watchdog (its stand-in for the kernel OOM killer)"
            elif sig == 9:
                text += " (SIGKILL is what the kernel OOM killer sends)"
            cause = _cause_for_signal(sig)
            found.append(_Finding(cause, text, strong=cause != "worker_exit"))
        else:
            found.append(_Finding("worker_exit", f"{who} pid {w.pid}: exited with code {w.exitcode} "
                                  "(no signal)", strong=w.role == "dataloader_worker"))
    worker_pids = {w.pid for w in facts.workers}
    for k in facts.watchdog_kills:
        budget = k.get("budget") or 0
        rss = k.get("rss") or 0
        if k.get("main"):
            found.append(_Finding("oom_killed", f"main process SIGKILLed by the lab's memory watchdog at "
                                  f"{rss / 2**20:.0f} MiB RSS (budget {budget / 2**20:.0f} MiB)"))
        elif k.get("pid") not in worker_pids or not any(w.pid == k.get("pid") and w.exitcode for w in
                                                         facts.workers):
            found.append(_Finding("oom_killed", f"pid {k.get('pid')} SIGKILLed by the lab's memory watchdog "
                                  f"at {rss / 2**20:.0f} MiB RSS (budget {budget / 2**20:.0f} MiB)"))
    return found


def _main_findings(facts: _Facts) -> list:
    found = []
    if facts.outcome == "failed" and facts.main_signal:
        sig = facts.main_signal
        if not (sig == 9 and any(k.get("main") for k in facts.watchdog_kills)):
            cause = _cause_for_signal(sig)
            extra = " (SIGKILL is what the kernel OOM killer sends)" if sig == 9 else ""
            found.append(_Finding(cause, f"main process killed by {_signame(sig)}{extra}",
                                  strong=cause != "worker_exit"))
    if facts.outcome == "timed_out":
        found.append(_Finding("hang", f"no result before the run's time limit: {facts.reason or 'timed out'}",
                              strong=False))
        where = _stuck_where(facts.stderr)
        if where:
            found.append(_Finding("hang", where, strong=False))
    return found


def _stuck_where(stderr: str) -> str:
    """What the faulthandler dump taken before the runner's kill says the main process was doing."""
    dump = stderr[stderr.rfind("most recent call first"):] if "most recent call first" in stderr else ""
    if not dump:
        return ""
    if re.search(r"in (_try_get_data|_get_data|_next_data)\b", dump):
        return ("faulthandler dump: the main process was waiting for a batch from the workers "
                "(DataLoader _try_get_data), and none came")
    if re.search(r"popen_(spawn|forkserver)\w*\.py.*\n?.*in _launch|in _launch", dump):
        return "faulthandler dump: the main process was blocked starting a worker (sending it the dataset)"
    m = re.search(r'File "([^"]+)", line (\d+) in (\w+)', dump)
    return f"faulthandler dump: the main process was in {m.group(3)} ({m.group(1)}:{m.group(2)})" if m else ""


def _gather(facts: _Facts) -> list:
    findings = []
    for chain in facts.chains:
        for e in chain:
            if e.origin == "main":
                where = "exception that ended the script" if e.link is None else f"its __{e.link}__"
            elif e.origin == "loader":
                where = "exception from the DataLoader (caught by the script)" if e.link is None \
                    else f"its __{e.link}__"
            else:
                where = "the exception" if e.link is None else f"its __{e.link}__"
            findings.extend(_classify_exception(e, where))
    findings.extend(_worker_findings(facts))
    findings.extend(_main_findings(facts))
    findings.extend(facts.live_findings)
    findings.extend(_stderr_findings(facts))
    for line in _startup_failures(facts)[:2]:
        findings.append(_Finding("worker_exit", f"stderr: a spawned worker failed while starting: {_short(line)}",
                                 strong=False, detail=line))
    if re.search(r"SemLock\._rebuild", facts.stderr) and "FileNotFoundError" in facts.stderr:
        facts.notes.append("a spawned worker could not open a multiprocessing semaphore (/dev/shm/sem.mp-*) of "
                           "its parent: something removed it from /dev/shm while the worker started (a /dev/shm "
                           "clean-up by another job, systemd RemoveIPC=yes)")
    return findings


def _loader_escape(facts: _Facts) -> Optional[_Exc]:
    """An exception that escaped a single-process DataLoader (num_workers=0): the dataset raised it."""
    if facts.escaped:
        return facts.escaped[0]
    if facts.source == "exception" and facts.iters and facts.iters[0].get("num_workers") == 0:
        return facts.chains[0][0] if facts.chains and facts.chains[0] else None
    if facts.chains and facts.chains[0] and re.search(r"torch/utils/data/(dataloader|_utils/fetch)\.py",
                                                       facts.chains[0][0].traceback or ""):
        return facts.chains[0][0]
    return None


def _single_process(facts: _Facts) -> bool:
    """True when the DataLoader ran without workers (or we cannot tell and no worker was seen)."""
    counts = [it.get("num_workers") for it in facts.iters if it.get("num_workers") is not None]
    if counts:
        return all(n == 0 for n in counts)
    return not facts.workers


def _choose(facts: _Facts, findings: list) -> tuple:
    """(cause, findings for it, confidence)."""
    real = [f for f in findings if f.cause != "_died"]
    for cause in PRECEDENCE:
        mine = [f for f in real if f.cause == cause]
        if mine:
            conf = "high" if any(f.strong for f in mine) or len(mine) > 1 else "medium"
            if cause == "hang":
                conf = "medium"
            return cause, mine, conf
    if any(f.cause == "_died" for f in findings):
        return "worker_exit", [f for f in findings if f.cause == "_died"], "low"
    return None, [], "high"


# =========================================================================== summaries
def _summary(cause: str, facts: _Facts, mine: list) -> str:
    first = mine[0].text if mine else ""
    caught = facts.outcome == "ok"
    tail = " (the script caught it and exited 0)" if caught and cause not in ("ok",) else ""
    inner = mine[0].detail if mine else ""
    text = {
        "worker_exception": f"a Python exception in the Dataset/collate_fn inside a worker: {inner}"
        if inner else "a Python exception in the Dataset/collate_fn",
        "unpicklable_dataset": "the dataset (or collate_fn/worker_init_fn) cannot be pickled to start a "
                               "spawn/forkserver worker",
        "main_not_importable": "spawn/forkserver workers could not import a class defined in __main__ "
                               "(notebook, stdin or python -c)",
        "missing_main_guard": "the script has no `if __name__ == \"__main__\":` guard: each spawned worker "
                              "re-ran it and tried to start workers of its own",
        "native_crash": "a worker died of a fatal signal in native code (segfault/abort), not a Python error",
        "oom_killed": "a process was SIGKILLed for using too much memory (the OOM killer's signal)",
        "shm_exhausted": "shared memory (/dev/shm) ran out while workers passed batches to the main process",
        "fd_limit": "the run hit the open-files limit (RLIMIT_NOFILE) while passing batches between processes",
        "worker_exit": "a worker process ended early (an exit code, SIGTERM, or an exit(0) before its work was "
                       "done) without a Python traceback",
        "timeout": "DataLoader(timeout=...) expired: a worker delivered no batch in time",
        "hang": "no progress until the run's time limit: a worker or the main process was stuck",
        "cuda_in_worker": "CUDA was touched inside a DataLoader worker (or on a build without CUDA)",
        UNKNOWN: "the run failed, but not in a DataLoader",
    }[cause]
    if cause == "native_crash":
        m = re.search(r"killed by (SIG\w+)", " ".join(f.text for f in mine))
        if m:
            text = f"a worker was killed by {m.group(1)} in native code (a crash in C/C++, not a Python error)"
    if cause == "oom_killed" and any("watchdog" in f.text for f in mine):
        text += "; here the lab's memory watchdog did it"
    if cause == "worker_exit":
        m = re.search(r"exited with (?:exit )?code (-?\d+)", " ".join(f.text for f in mine))
        if m:
            text = f"a worker exited with code {m.group(1)} without a Python traceback"
        startup = next((f.detail for f in mine if f.detail), None)
        if startup:
            text = f"a spawned worker died while starting, before loading any sample: {_short(startup, 120)}"
    if cause == "cuda_in_worker" and "inside a DataLoader worker" not in first and "stderr" not in first \
            and facts.source == "run" and not any(it.get("num_workers") for it in facts.iters):
        text = "CUDA was used on a machine or build without CUDA"
    return text + tail


# =========================================================================== environment probes
def _torch_build() -> tuple:
    """(version, cuda) of the installed torch, read from torch/version.py without importing torch."""
    mod = sys.modules.get("torch")
    if mod is not None and hasattr(mod, "__version__"):
        return str(mod.__version__), getattr(getattr(mod, "version", None), "cuda", None)
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return None, None
        path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, ImportError, ValueError):
        return None, None
    ver = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*(?:['\"]([^'\"]+)['\"]|None)", text, re.M)
    return (ver.group(1) if ver else None), (cuda.group(1) if cuda and cuda.group(1) else None)


def _meminfo() -> dict:
    out = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB" if n < 2**30 * 10 else f"{n / 2**30:.1f} GiB"


def environment_probes(options: Optional[dict] = None, iters: Optional[list] = None,
                       live: bool = False) -> list:
    """Short lines about this machine (and a run's limits) that bear on DataLoader failures."""
    options = options or {}
    lines = []
    ver, cuda = _torch_build()
    py = ".".join(map(str, sys.version_info[:3]))
    lines.append(f"python {py}; torch {ver or 'not installed'}"
                 + ("" if ver is None else f" ({'CUDA ' + cuda if cuda else 'CPU-only build'})"))
    methods = sorted({it.get("start_method") for it in iters or [] if it.get("start_method")})
    if methods:
        sm = f"start method used by the DataLoader: {', '.join(methods)}"
    elif options.get("start_method"):
        sm = f"start method of the run: {options['start_method']}"
    else:
        import multiprocessing

        chosen = multiprocessing.get_start_method(allow_none=True)
        default = multiprocessing.get_all_start_methods()[0]
        sm = f"start method: {chosen or default}" + ("" if chosen else " (platform default)")
    lines.append(sm)
    for it in (iters or [])[:1]:
        parts = [f"{k}={it.get(k)}" for k in ("num_workers", "batch_size", "prefetch_factor", "timeout",
                                               "sharing_strategy", "pin_memory") if k in it]
        if parts:
            lines.append("DataLoader: " + ", ".join(parts))
    if options.get("shm_size"):
        lines.append(f"/dev/shm of the run: a private tmpfs of {_mib(options['shm_size'])}")
    else:
        try:
            st = os.statvfs("/dev/shm")
            lines.append(f"/dev/shm: {_mib(st.f_bavail * st.f_frsize)} free of {_mib(st.f_blocks * st.f_frsize)}")
        except OSError:
            lines.append("/dev/shm: not present")
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        hard_s = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        if options.get("nofile"):
            lines.append(f"open-files limit of the run: {options['nofile']} (this shell: {soft}/{hard_s})")
        else:
            fds = ""
            if live:
                try:
                    fds = f", {len(os.listdir('/proc/self/fd'))} open now"
                except OSError:
                    pass
            lines.append(f"open-files limit (RLIMIT_NOFILE): soft {soft}, hard {hard_s}{fds}")
    except ImportError:
        pass
    mem = _meminfo()
    budget = options.get("memory_budget")
    if mem.get("MemAvailable"):
        line = f"memory available: {_mib(mem['MemAvailable'])} of {_mib(mem.get('MemTotal', 0))}"
        if budget:
            line += f"; run's memory budget (lab watchdog): {_mib(budget)}"
        lines.append(line)
    if live:
        main = sys.modules.get("__main__")
        if main is not None and not _main_file_ok(main):
            lines.append("this __main__ has no file a new process could import (notebook, stdin or -c): "
                         "spawn/forkserver workers cannot import classes defined here")
        torch = sys.modules.get("torch")
        if torch is not None:
            try:
                lines.append(f"CUDA: available={torch.cuda.is_available()}, "
                             f"initialised in this process={torch.cuda.is_initialized()}")
            except Exception:  # noqa: BLE001
                pass
    return lines


# =========================================================================== explain
def explain(obj) -> Diagnosis:
    """Name the cause of a failed (or successful) DataLoader run.

    ``obj`` is a :class:`~labutils.result.RunResult` or a live exception (``except Exception as e:
    labutils.explain(e)``). Returns a :class:`Diagnosis`.
    """
    if isinstance(obj, BaseException):
        facts = _facts_from_exception(obj)
    elif hasattr(obj, "outcome") and hasattr(obj, "loader_events"):
        if obj.outcome == "unsupported":
            return Diagnosis(UNSUPPORTED, f"the run could not start here: {obj.reason}",
                             [f"runner: {obj.reason}"], [], "high", "run")
        facts = _facts_from_result(obj)
    else:
        raise TypeError(f"explain() takes a RunResult or an exception, not {type(obj).__name__}")

    findings = _gather(facts)
    cause, mine, conf = _choose(facts, findings)
    failed = facts.outcome != "ok" or bool(findings)
    if cause is None:
        if not failed:
            cause, conf = "ok", "high"
        elif _loader_escape(facts) is not None and _single_process(facts):
            e = _loader_escape(facts)
            cause, conf = "worker_exception", "medium"
            mine = [_Finding("worker_exception", f"{e.type}: {_short(e.message)} escaped the DataLoader "
                             "iterator (raised by the Dataset/collate_fn in the main process, num_workers=0)",
                             detail=f"{e.type}: {_short(e.message, 120)}")]
        else:
            cause, conf = UNKNOWN, "medium"
            e = facts.chains[0][0] if facts.chains and facts.chains[0] else None
            text = (f"{e.type}: {_short(e.message)}" if e else
                    f"main process {('exit ' + str(facts.returncode)) if facts.returncode is not None else ''}")
            mine = [_Finding(UNKNOWN, f"the script failed outside the DataLoader: {text}")]

    evidence = [f.text for f in mine]
    others = [f for f in findings if f not in mine and f.text not in evidence]
    evidence.extend(f"also seen: {f.text}" for f in others)
    evidence.extend(_status_lines(facts))
    evidence.extend(facts.notes)
    try:
        evidence.extend(environment_probes(facts.options, facts.iters, live=facts.source == "exception"))
    except Exception as exc:  # noqa: BLE001 - probes are extra, never fatal
        evidence.append(f"environment probes failed: {exc!r}")
    if cause == "unpicklable_dataset" and facts.live_dataset is not None:
        evidence.extend(_blockers(facts.live_dataset))

    if cause == "ok":
        summary = "the loader finished; no worker failed"
        if facts.source == "run" and not facts.iters:
            summary = "the script finished; it created no DataLoader iterator"
    else:
        summary = _summary(cause, facts, mine)
    return Diagnosis(cause, summary, evidence, _fixes(cause), conf, facts.source)


def _status_lines(facts: _Facts) -> list:
    lines = []
    if facts.source == "run":
        if facts.outcome == "timed_out":
            lines.append("main process: killed by the runner after the time limit")
        elif facts.returncode is not None:
            rc = facts.returncode
            lines.append("main process: " + (f"killed by {_signame(-rc)}" if rc < 0 else f"exit code {rc}"))
    for w in facts.workers:
        if w.exitcode is None:
            state = "exit status not recorded (the run was killed before it could be read)" \
                if facts.source == "run" else "still running or not joined"
        elif w.exitcode < 0:
            state = f"killed by {_signame(-w.exitcode)}"
        else:
            state = f"exit code {w.exitcode}"
        role = "worker" if w.role == "dataloader_worker" else "child process"
        lines.append(f"{role} pid {w.pid}: {state}")
    return lines


def _blockers(dataset) -> list:
    try:
        from .pickling import find_unpicklable

        found = find_unpicklable(dataset, "dataset")
    except Exception as exc:  # noqa: BLE001
        return [f"find_unpicklable failed: {exc!r}"]
    return [f"cannot pickle: {b.path} ({b.type_name})" for b in found[:5]]
