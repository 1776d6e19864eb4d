"""Diagnose a notebook: execute it cell by cell in a real Jupyter kernel (nbclient) started inside an
isolated run, and make a RunResult of what the kernel recorded (its exception, loader events, workers)."""

from __future__ import annotations

import json
import os
from typing import Optional

from . import rundir
from .isolate import run_isolated
from .result import ExceptionInfo, ProcessInfo, RunResult

__all__ = ["run_notebook"]


# =========================================================================== notebooks
def run_notebook(path: str, kw: dict, interval: float):
    """Execute the notebook in a Jupyter kernel inside an isolated run; a RunResult of the kernel's evidence."""
    start_method = kw.pop("start_method", None)
    code = _NB_RUNNER.replace("@@CONFIG@@", repr(json.dumps({
        "path": os.path.abspath(path), "start_method": start_method, "preamble": _KERNEL_PREAMBLE})))
    outer = run_isolated(code, sample_interval=interval, cwd=os.path.dirname(os.path.abspath(path)) or None,
                         **kw)
    return _kernel_result(outer, path, start_method)


def _kernel_result(outer, path: str, start_method: Optional[str]):
    """A RunResult made of what the kernel recorded (its exception, loader events, workers), inside the
    outer run's limits, outcome and stderr (the kernel's and its workers' fd 2 go there)."""
    nb = (outer.values or {}).get("notebook")
    if outer.outcome == "unsupported" or not isinstance(nb, dict):
        # stopped before the runner could report (a stall, the time limit, the runner itself killed):
        # the run's own records stand, with the cell that was running
        outer.__dict__["failing_cell"] = (outer.values or {}).get("notebook_cell")
        return outer
    exits = {int(k): v for k, v in (nb.get("exits") or {}).items()}
    seen = {k["pid"] for k in outer.watchdog_kills or []}
    workers = []
    for rec in nb.get("procs") or []:
        pid = rec.get("pid")
        outer_info = next((w for w in outer.workers if w.pid == pid), None)
        workers.append(ProcessInfo(
            pid=pid, name=rec.get("name", ""),
            role="dataloader_worker" if str(rec.get("target", "")).endswith("_worker_loop") else "process",
            exitcode=exits.get(pid), killed_by_watchdog=pid in seen,
            peak_rss=outer_info.peak_rss if outer_info else None))
    chain = [ExceptionInfo(**{k: e.get(k) for k in ("type", "message", "module", "link", "traceback")
                              if k in e}) for e in nb.get("exc") or []]
    kernel_died = nb.get("kernel_died")
    if outer.outcome == "timed_out":
        outcome, rc = "timed_out", outer.returncode
    elif kernel_died:
        rc = nb.get("kernel_returncode")
        outcome = "failed"
    elif nb.get("error"):
        outcome, rc = "failed", 1
    elif outer.outcome != "ok":
        outcome, rc = outer.outcome, outer.returncode
    else:
        outcome, rc = "ok", 0
    main_kills = [k for k in outer.watchdog_kills or [] if k.get("pid") == nb.get("kernel_pid")]
    kills = [dict(k, main=True) if k in main_kills else k for k in outer.watchdog_kills or []]
    result = RunResult(
        outcome=outcome, returncode=rc, signal=-rc if isinstance(rc, int) and rc < 0 else None,
        workers=workers, exceptions=chain, loader_events=list(outer.loader_events or []),
        stdout=nb.get("stdout", "") or outer.stdout, stderr=(outer.stderr or "") + (nb.get("stderr") or ""),
        wall_time=outer.wall_time, peak_rss=outer.peak_rss, watchdog_kills=kills,
        reason=outer.reason or nb.get("error_text"), options=dict(outer.options, start_method=start_method,
                                                                  notebook=os.path.abspath(path)),
    )
    for name in ("memory_limit", "stall", "stacks"):
        if getattr(outer, name, None) is not None:
            try:
                setattr(result, name, getattr(outer, name))
            except AttributeError:
                pass
    result.__dict__["failing_cell"] = nb.get("cell")
    return result


#: Runs in the isolated process: start a kernel, run the notebook, record and emit the evidence, and
#: leave no kernel process behind.
_NB_RUNNER = r'''
import json, os, signal, sys, time
CFG = json.loads(@@CONFIG@@)
RUN_DIR = os.environ["LABUTILS_RUN_DIR"]
EVID = os.path.join(RUN_DIR, "kernel")
os.makedirs(EVID, exist_ok=True)
os.environ["LABUTILS_KERNEL_EVIDENCE"] = EVID
os.environ["LABUTILS_KERNEL_START_METHOD"] = CFG["start_method"] or ""

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, DeadKernelError

nb = nbformat.read(CFG["path"], as_version=4)
original = list(nb.cells)
nb.cells.insert(0, nbformat.v4.new_code_cell(CFG["preamble"]))
client = NotebookClient(nb, timeout=None, kernel_name="python3", allow_errors=False,
                        resources={"metadata": {"path": os.path.dirname(CFG["path"])}})
state = {"kernel_pid": None, "cell": None, "error": None}

def describe(cell_index):
    idx = cell_index - 1
    src = original[idx].source if 0 <= idx < len(original) else ""
    code_index = sum(1 for c in original[:idx + 1] if c.cell_type == "code")
    head = next((ln for ln in src.splitlines() if ln.strip() and not ln.startswith("#")), src[:80])
    return {"index": idx, "code_index": code_index, "head": head[:120]}

def on_cell_start(cell, cell_index):
    if state["kernel_pid"] is None:
        proc = getattr(getattr(client.km, "provisioner", None), "process", None)
        state["kernel_pid"] = getattr(proc, "pid", None)
    state["cell"] = cell_index
    if cell_index >= 1:  # the cell running now, in case the run is stopped (stall, time limit) in it
        with open(os.path.join(RUN_DIR, @@EMITTED@@), "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"notebook_cell": describe(cell_index)}) + "\n")

client.on_cell_start = on_cell_start

def read_jsonl(name):
    out = []
    try:
        with open(os.path.join(EVID, name), encoding="utf-8") as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return out

def read_json(name):
    try:
        with open(os.path.join(EVID, name), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None

def kill_leftovers(pid):
    """SIGKILL what is left of the kernel: its process group if the kernel is still ours, and any
    process that carries this run's directory in its environment (workers of the kernel)."""
    import psutil
    if pid:
        try:
            kproc = psutil.Process(pid)
            if kproc.ppid() == os.getpid():
                os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (psutil.Error, ProcessLookupError, PermissionError, OSError):
            pass
    def ours():
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if proc.pid == os.getpid():
                continue
            try:
                if proc.environ().get("LABUTILS_KERNEL_EVIDENCE") == EVID:
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        return found

    def tracker(proc):
        return "resource_tracker" in " ".join(proc.info.get("cmdline") or [])

    for proc in ours():
        if not tracker(proc):
            try:
                proc.kill()
            except psutil.Error:
                pass
    # the kernel's resource_tracker unlinks the semaphores the kernel and its workers left once they
    # are gone; give it that moment before anything else
    trackers = [p for p in ours() if tracker(p)]
    _gone, alive = psutil.wait_procs(trackers, timeout=5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass

kernel_died = False
kernel_rc = None
error_text = None
try:
    client.execute()
except CellExecutionError as exc:
    state["error"] = "cell"
except DeadKernelError as exc:
    state["error"] = "dead"
    kernel_died = True
    error_text = f"the kernel died: {exc}"[:300]
except Exception as exc:
    state["error"] = "runner"
    error_text = f"{type(exc).__name__}: {exc}"[:300]
finally:
    proc = getattr(getattr(client.km, "provisioner", None), "process", None) if client.km else None
    if proc is not None:
        try:
            kernel_rc = proc.wait(timeout=2)
        except Exception:
            kernel_rc = proc.poll()
    kill_leftovers(state["kernel_pid"])

cell = None
if state["error"] in ("cell", "dead") and state["cell"] is not None and state["cell"] >= 1:
    cell = describe(state["cell"])
streams = []
for c in nb.cells[1:]:
    for out in c.get("outputs", []):
        if out.get("output_type") == "stream":
            streams.append((out.get("name"), out.get("text", "")))
record = {
    "cell": cell, "error": state["error"], "error_text": error_text, "kernel_died": kernel_died,
    "kernel_returncode": kernel_rc, "kernel_pid": state["kernel_pid"],
    "exc": read_json(@@EXC@@) if state["error"] == "cell" else None,
    "procs": read_jsonl(@@PROCS@@),
    "exits": read_json("exits.json") or {},
    "stdout": "".join(t for n, t in streams if n == "stdout"),
    "stderr": "".join(t for n, t in streams if n == "stderr"),
}
line = json.dumps({"notebook": record}, default=repr) + "\n"
with open(os.path.join(RUN_DIR, @@EMITTED@@), "a", encoding="utf-8") as fh:
    fh.write(line)
print(f"notebook {CFG['path']}: {state['error'] or 'ran to the end'}")
'''

#: The first cell the kernel runs (not part of the learner's notebook): the same evidence the bootstrap
#: of an isolated script records. DataLoader iterators, their progress and the exceptions that escape
#: them go to the run's own loader.jsonl (so the runner sees progress and stalls in the kernel as in a
#: script); processes the kernel starts, their exit codes and a failing cell's exception go under
#: the run directory's kernel/ folder.
_KERNEL_PREAMBLE = r'''
def __labutils_instrument():
    import faulthandler, json, os, signal, sys, time, traceback, multiprocessing
    from multiprocessing import process
    evid = os.environ["LABUTILS_KERNEL_EVIDENCE"]
    run_dir = os.environ["LABUTILS_RUN_DIR"]
    main_pid = os.getpid()
    counter = [0]
    if hasattr(signal, "SIGUSR1"):  # the runner's stack dump on a stall: into the run's stderr
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    method = os.environ.get("LABUTILS_KERNEL_START_METHOD")
    if method:
        multiprocessing.set_start_method(method, force=True)
    started = []

    def append(name, record, folder=None):
        try:
            with open(os.path.join(folder or evid, name), "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record, default=repr) + "\n")
        except OSError:
            pass

    chain_module = {}
    exec(__LABUTILS_CHAIN_SOURCE__, chain_module)  # labutils/diagnosis/chain.py, the one copy
    chain = chain_module["records"]

    original_start = process.BaseProcess.start

    def start(self):
        target = getattr(self, "_target", None)
        original_start(self)
        if os.getpid() != main_pid:
            return
        started.append(self)
        append(@@PROCS@@, {"pid": self.pid, "name": self.name, "t": time.time(),
                               "target": getattr(target, "__qualname__", repr(target))})

    process.BaseProcess.start = start

    def exits():
        codes = {}
        for p in started:
            try:
                if p.exitcode is None:
                    p.join(0.05)
                codes[str(p.pid)] = p.exitcode
            except Exception:
                codes[str(p.pid)] = None
        try:
            with open(os.path.join(evid, "exits.json"), "w", encoding="utf-8") as fh:
                json.dump(codes, fh)
        except OSError:
            pass

    def patch(module):
        base = module._BaseDataLoaderIter
        original_next, original_init = base.__next__, base.__init__
        original_iter = module.DataLoader.__iter__

        def __iter__(self):
            try:
                return original_iter(self)
            except BaseException as exc:
                append(@@LOADER@@, {"event": "init_error", "t": time.time(), "chain": chain(exc)}, run_dir)
                raise

        def __init__(self, loader, *a, **kw):
            original_init(self, loader, *a, **kw)
            ctx = getattr(loader, "multiprocessing_context", None)
            try:
                m = ctx.get_start_method() if ctx is not None else multiprocessing.get_start_method()
            except Exception:
                m = None
            counter[0] += 1
            self._lab_iter, self._lab_batches, self._lab_last = counter[0], 0, 0.0
            append(@@LOADER@@, {"event": "iter", "t": time.time(), "iter": counter[0],
                                    "num_workers": loader.num_workers, "timeout": loader.timeout,
                                    "start_method": m, "batch_size": loader.batch_size,
                                    "prefetch_factor": loader.prefetch_factor, "pin_memory": loader.pin_memory,
                                    "dataset": type(loader.dataset).__module__ + "."
                                    + type(loader.dataset).__qualname__}, run_dir)

        def progress(self):
            self._lab_last = time.time()
            append(@@LOADER@@, {"event": "progress", "t": self._lab_last, "iter": self._lab_iter,
                                    "batches": self._lab_batches}, run_dir)

        def __next__(self):
            try:
                data = original_next(self)
            except StopIteration:
                if hasattr(self, "_lab_iter"):
                    progress(self)
                raise
            except BaseException as exc:
                append(@@LOADER@@, {"event": "error", "t": time.time(), "chain": chain(exc)}, run_dir)
                if hasattr(self, "_lab_iter"):
                    progress(self)
                raise
            if hasattr(self, "_lab_iter"):
                self._lab_batches += 1
                if time.time() - self._lab_last >= 0.25:
                    progress(self)
            return data

        module.DataLoader.__iter__ = __iter__
        base.__init__, base.__next__ = __init__, __next__

    import importlib.abc
    import importlib.machinery

    class Finder(importlib.abc.MetaPathFinder):
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
                    patch(module)
                except Exception as exc:
                    append(@@LOADER@@, {"event": "patch_failed", "error": repr(exc)})

            spec.loader.exec_module = exec_module
            return spec

    if "torch.utils.data.dataloader" in sys.modules:
        patch(sys.modules["torch.utils.data.dataloader"])
    else:
        sys.meta_path.insert(0, Finder())

    def post_run_cell(result):
        err = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        if err is not None:
            with open(os.path.join(evid, @@EXC@@), "w", encoding="utf-8") as fh:
                json.dump(chain(err), fh, default=repr)
        exits()

    get_ipython().events.register("post_run_cell", post_run_cell)  # noqa: F821


__labutils_instrument()
del __labutils_instrument
'''
_CHAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "diagnosis", "chain.py")
with open(_CHAIN, encoding="utf-8") as _fh:
    _KERNEL_PREAMBLE = _KERNEL_PREAMBLE.replace("__LABUTILS_CHAIN_SOURCE__", repr(_fh.read()))
del _fh

# the run directory's names, from their one home (the code above runs in the run and in its kernel)
for _name in ('EMITTED', 'EXC', 'LOADER', 'PROCS'):
    _NB_RUNNER = _NB_RUNNER.replace(f"@@{_name}@@", repr(getattr(rundir, _name)))
    _KERNEL_PREAMBLE = _KERNEL_PREAMBLE.replace(f"@@{_name}@@", repr(getattr(rundir, _name)))
