"""``python -m labutils diagnose [OPTIONS] SCRIPT|NOTEBOOK [ARGS...]``: run it isolated and name the cause.

A script runs unchanged in a fresh process under the same limits as :func:`labutils.run_isolated`.
A notebook (``.ipynb``) is executed cell by cell in a real Jupyter kernel (nbclient) started inside
that isolated run, so the limits apply to the kernel and its workers too, and a class defined in a
cell is as unimportable for spawn workers as it is in JupyterLab; the report names the failing cell.
Even a script that catches the DataLoader error and exits 0 is diagnosed from what happened.

A run is stopped early only by ``--stall`` (no batch delivered for that long while workers are alive:
diagnosed as a hang, with the stacks of the stuck processes) or ``--timeout`` (a total limit, off by
default so that a long healthy training is never cut). Options come before SCRIPT; everything after
SCRIPT is the script's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

PROG = "python -m labutils diagnose"
DEFAULT_STALL = 300.0
DEFAULT_TIMEOUT = None  # no total limit: a long healthy run is not a hang

_EPILOG = """torchrun: `python -m labutils diagnose --torchrun --nproc-per-node 2 train.py ARGS` launches
train.py as torchrun would (CPU or GPU, a local rendezvous) and names the first failed rank and why.

exit status: 0 when the run was diagnosed `ok`, 1 when a cause was found, 2 for a usage error
(missing file, not a Python script or notebook, bad option)."""


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line and exit status 2, never a traceback
        if "arguments are required" in message:
            message = "no SCRIPT given"
        elif message.startswith("unrecognized arguments"):
            message = f"unknown option {message.split(':', 1)[1].strip()} (options go before SCRIPT; see --help)"
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Run a training script or notebook isolated (a fresh process; the "
                "limits below apply to it only) and name the cause of its DataLoader failure. Options go "
                "before SCRIPT; everything after SCRIPT is passed to it.", epilog=_EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stall", metavar="SECONDS", type=_positive("--stall"), default=None,
                   help=f"stop the run when no batch is delivered for this long while DataLoader workers are "
                        f"alive, and diagnose a hang with the stacks of the stuck processes (default "
                        f"{DEFAULT_STALL:g}; 0 turns it off)")
    p.add_argument("--timeout", metavar="SECONDS", type=_positive("--timeout"), default=None,
                   help="stop the run after this long in total, whatever it is doing (default: no limit)")
    p.add_argument("--memory-budget", metavar="SIZE", type=_size("--memory-budget"),
                   help="memory limit of the run (e.g. 600M): the kernel's OOM killer in a cgroup where the "
                        "OS allows, else the lab's watchdog SIGKILLs any process over it")
    p.add_argument("--shm-size", metavar="SIZE", type=_size("--shm-size"),
                   help="run with a private /dev/shm of SIZE (e.g. 8M; Linux, needs mount namespaces)")
    p.add_argument("--nofile", metavar="N", type=_nofile, help="RLIMIT_NOFILE soft limit of the run")
    p.add_argument("--max-processes", metavar="N", type=_max_processes,
                   help="at most N tasks (processes and threads) in the run at once: a pids cgroup where the lab "
                        "may make one, else RLIMIT_NPROC (not for root)")
    p.add_argument("--start-method", metavar="METHOD", type=_method,
                   help="fork, spawn or forkserver for the run's multiprocessing (a notebook's kernel too)")
    p.add_argument("--stdin-main", action="store_true",
                   help="run the script as if pasted into a notebook / python - (its __main__ has no file, so "
                        "spawn/forkserver workers cannot import classes defined in it)")
    p.add_argument("--launcher", choices=("cold", "auto", "warm"), default=None,
                   help="cold (default for one command: a fresh interpreter, as `python SCRIPT`), or auto/warm: "
                        "start from the lab's warm template (worth it only for many runs in one process; "
                        "LABUTILS_LAUNCHER sets the default)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (cause, summary, evidence, fixes, outcome, exit, workers, "
                        "memory_limit, ...) instead of the report")
    p.add_argument("--quiet", action="store_true", help="do not echo the script's own output in the report")
    tr = p.add_argument_group("torchrun launches", "run SCRIPT with torchrun (torch.distributed.run, "
                              "--standalone: a local rendezvous on a free port) as one isolated run: the "
                              "launcher, every rank and their DataLoader workers; the diagnosis names the "
                              "first failed rank (torchrun's Root Cause block) and its cause")
    tr.add_argument("--torchrun", action="store_true", help="launch SCRIPT with torchrun instead of python")
    tr.add_argument("--nproc-per-node", metavar="N", type=_count("--nproc-per-node", 1), default=None,
                    help="ranks on this machine (with --torchrun; default 1, as torchrun)")
    tr.add_argument("--max-restarts", metavar="K", type=_count("--max-restarts", 0), default=None,
                    help="torchrun's --max-restarts: restart every rank up to K times after a failure "
                         "(with --torchrun; default 0)")
    p.add_argument("script", metavar="SCRIPT", help="a Python script, or a notebook (.ipynb)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for the script")
    return p


def _positive(name: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds") from None
        if value < 0 or (value == 0 and name != "--stall"):
            raise argparse.ArgumentTypeError(f"{text!r}: must be positive")
        return value

    return parse


def _size(name: str):
    def parse(text: str) -> str:
        from ..runner.sizes import parse_size

        try:
            parse_size(text)
        except (ValueError, TypeError) as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
        return text

    return parse


def _count(name: str, least: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value}: must be at least {least}")
        return value

    parse.__name__ = name
    return parse


def _nofile(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give an integer") from None
    if value < 16:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 16 (Python itself needs a few descriptors)")
    return value


def _max_processes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give an integer") from None
    if value < 2:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 2 (the run's main process and its threads)")
    return value


def _method(text: str) -> str:
    if text not in ("fork", "spawn", "forkserver"):
        raise argparse.ArgumentTypeError(f"{text!r}: use fork, spawn or forkserver")
    return text


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    if not argv:
        raise UsageError("no SCRIPT given")
    return build_parser().parse_args(argv)


def _run_supports(name: str) -> bool:
    import inspect

    from ..runner.isolate import run_isolated

    return name in inspect.signature(run_isolated).parameters


def _check_torchrun(args: argparse.Namespace, kind: str) -> None:
    """One-line usage errors for the torchrun options."""
    if not args.torchrun:
        for flag, value in (("--nproc-per-node", args.nproc_per_node), ("--max-restarts", args.max_restarts)):
            if value is not None:
                raise UsageError(f"{flag} is a torchrun option: add --torchrun to launch SCRIPT with torchrun")
        return
    if kind == "notebook":
        raise UsageError("--torchrun launches a Python script, not a notebook")
    if args.stdin_main:
        raise UsageError("--stdin-main cannot be used with --torchrun (torchrun runs SCRIPT as a file in each rank)")
    if args.stall is not None:
        raise UsageError("--stall cannot watch the ranks' DataLoaders under --torchrun; use --timeout SECONDS "
                         "for a total limit")


def _limits(args: argparse.Namespace) -> dict:
    kw: dict = {"timeout": args.timeout if args.timeout is not None else DEFAULT_TIMEOUT}
    stall = DEFAULT_STALL if args.stall is None else args.stall
    if getattr(args, "torchrun", False):
        stall = 0  # the ranks' batches are not counted: a stall watch would stop a healthy launch
    if stall:
        if _run_supports("stall"):
            kw["stall"] = stall
        elif args.stall is not None:
            raise UsageError("--stall: this runner cannot watch the loader's progress yet (run_isolated has no "
                             "stall=); use --timeout SECONDS for a total limit")
    for name in ("memory_budget", "shm_size", "nofile", "start_method", "max_processes"):
        value = getattr(args, name)
        if value is not None:
            kw[name] = value
    if args.stdin_main:
        kw["notebook_main"] = True
    # one run per command: a warm template would cost this process the same torch import it saves the run
    kw["launcher"] = args.launcher or os.environ.get("LABUTILS_LAUNCHER") or "cold"
    return kw


def _check_script(script: str) -> str:
    """``"script"`` or ``"notebook"``; a UsageError with one line for anything else."""
    if not os.path.exists(script):
        raise UsageError(f"{script}: no such file")
    if os.path.isdir(script):
        raise UsageError(f"{script}: is a directory, give a Python script or a notebook")
    try:
        with open(script, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise UsageError(f"{script}: cannot read it ({exc.strerror})") from None
    if script.endswith(".ipynb"):
        return _check_notebook(script, data)
    if b"\x00" in data[:8192]:
        raise UsageError(f"{script}: not a Python script (binary file)")
    try:  # the bytes, as Python reads a script: a UTF-8 BOM or a coding cookie decides the encoding
        compile(data, script, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise UsageError(f"{script}: not a Python script (syntax error at line {exc.lineno}: {exc.msg})") \
            from None
    except ValueError as exc:
        raise UsageError(f"{script}: not a Python script ({exc})") from None
    return "script"


def _check_notebook(path: str, data: bytes) -> str:
    try:
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{path}: not a Jupyter notebook (not JSON: {exc})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise UsageError(f"{path}: not a Jupyter notebook (no list of cells)")
    if int(nb.get("nbformat", 0) or 0) < 4:
        raise UsageError(f"{path}: notebook format {nb.get('nbformat')} is too old; open and save it in "
                         "JupyterLab (format 4)")
    try:
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError:
        raise UsageError("running a notebook needs nbclient and nbformat (installed with jupyterlab): "
                         "pip install nbclient") from None
    return "notebook"


def _workers(result) -> list:
    out = []
    for w in result.workers:
        out.append({"pid": w.pid, "role": w.role, "exitcode": w.exitcode, "signal": w.signal,
                    "status": w.status, "killed_by_watchdog": w.killed_by_watchdog,
                    "killed_by_kernel_oom": bool(getattr(w, "killed_by_kernel_oom", False)),
                    "peak_rss": w.peak_rss})
    return out


def report_dict(result, script: str, script_args: Sequence[str]) -> dict:
    """The ``--json`` object for a run."""
    d = result.diagnosis
    out = {
        "cause": d.cause, "summary": d.summary, "confidence": d.confidence, "recovered": d.recovered,
        "evidence": d.evidence,
        "fixes": [{"text": f.text, "notebook": f.notebook, "path": f.path} for f in d.fixes],
        "outcome": result.outcome, "exit": result.exit_text, "returncode": result.returncode,
        "signal": result.signal, "reason": result.reason,
        "workers": _workers(result),
        "exceptions": [{"type": e.type, "message": e.message, "link": e.link} for e in result.exceptions],
        "loader_errors": [[{"type": e.type, "message": e.message, "link": e.link} for e in chain]
                          for chain in result.loader_errors],
        "watchdog_kills": result.watchdog_kills,
        "memory_limit": getattr(result, "memory_limit", None),
        "stall": getattr(result, "stall", None),
        "launcher": getattr(result, "launcher", None),
        "wall_time": round(result.wall_time, 3),
        "script": script, "args": list(script_args), "options": result.options,
        "stdout": result.stdout, "stderr": result.stderr,
    }
    cell = getattr(result, "failing_cell", None)
    if cell is not None or script.endswith(".ipynb"):
        out["cell"] = cell
    for name in ("process", "unexplained", "tree"):  # the failing process's place in the tree; loose texts
        if getattr(d, name, None):
            out[name] = getattr(d, name)
    if getattr(d, "launch", None) is not None:
        out["launch"] = d.launch  # torchrun: the first failed rank, its exit code, pid, every failure
    return out


def _report_text(result, script: str, quiet: bool) -> str:
    lines = []
    if not quiet:
        if result.stdout.strip():
            lines += ["--- script stdout " + "-" * 50, result.stdout.rstrip()]
        if result.stderr.strip():
            lines += ["--- script stderr (workers included) " + "-" * 31, result.stderr.rstrip()]
        if lines:
            lines.append("-" * 68)
    d = result.diagnosis
    lines.append(f"diagnose {script}: {result.outcome}, main process {result.exit_text}, "
                 f"{result.wall_time:.1f} s")
    cell = getattr(result, "failing_cell", None)
    if cell:
        lines.append(f"failing cell: {cell['index']} (code cell {cell['code_index']}): {cell['head']}")
    if result.reason:
        lines.append(f"reason: {result.reason}")
    lines.append(str(d))
    return "\n".join(lines)


def _usage_fail(message: str) -> int:
    print(f"labutils diagnose: {message}", file=sys.stderr)
    print(f"usage: {PROG} [OPTIONS] SCRIPT|NOTEBOOK [ARGS...]   (--help for the options)", file=sys.stderr)
    return 2


def diagnose_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m labutils diagnose``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        build_parser().print_help()
        return 0
    try:
        args = _parse(argv)
        kind = _check_script(args.script)
        if kind == "notebook" and args.stdin_main:
            raise UsageError("--stdin-main is for scripts; a notebook always runs in a kernel whose __main__ "
                             "has no file")
        if kind == "notebook" and args.args:
            raise UsageError("a notebook takes no arguments")
        _check_torchrun(args, kind)
        kw = _limits(args)
    except UsageError as exc:
        return _usage_fail(str(exc))
    except SystemExit as exc:  # argparse's own --help inside the options
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2

    from ..runner.isolate import IsolationError, run_isolated

    # The monitor only needs to sample often when it enforces a memory budget; otherwise a slower
    # pace keeps the CPU it takes from the script (on 2 cores) out of the measured overhead.
    interval = 0.05 if "memory_budget" in kw else 0.5
    try:
        if kind == "notebook":
            result = _run_notebook(args.script, kw, interval)
        elif args.torchrun:
            from ..runner.torchrun import run_torchrun

            result = run_torchrun(args.script, args.args, nproc_per_node=args.nproc_per_node or 1,
                                  max_restarts=args.max_restarts or 0, sample_interval=interval, **kw)
        else:
            result = run_isolated(file=args.script, argv=args.args, sample_interval=interval, **kw)
    except IsolationError as exc:
        flag = "--" + exc.argument.replace("_", "-") if getattr(exc, "argument", None) else None
        print(f"labutils diagnose: {exc.for_option(flag) if flag else exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("labutils diagnose: interrupted; the run was stopped", file=sys.stderr)
        return 130
    if result.outcome == "unsupported":
        print(f"labutils diagnose: the run could not start: {result.reason}", file=sys.stderr)
        if args.json:
            print(json.dumps({"cause": "unsupported", "summary": result.reason, "evidence": [],
                              "fixes": [], "outcome": result.outcome, "exit": result.exit_text,
                              "workers": [], "memory_limit": getattr(result, "memory_limit", None)}))
        return 2
    try:
        if args.json:
            print(json.dumps(report_dict(result, args.script, args.args), default=repr))
        else:
            print(_report_text(result, args.script, args.quiet))
        sys.stdout.flush()
    except BrokenPipeError:  # `diagnose ... | head`: the reader left; that is not an error of the run
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0 if result.diagnosis.cause == "ok" else 1


# =========================================================================== notebooks
def _run_notebook(path: str, kw: dict, interval: float):
    """Execute the notebook in a Jupyter kernel inside an isolated run; a RunResult of the kernel's evidence."""
    from ..runner.isolate import run_isolated

    start_method = kw.pop("start_method", None)
    code = _NB_RUNNER.replace("@@CONFIG@@", repr(json.dumps({
        "path": os.path.abspath(path), "start_method": start_method, "preamble": _KERNEL_PREAMBLE})))
    outer = run_isolated(code, sample_interval=interval, cwd=os.path.dirname(os.path.abspath(path)) or None,
                         **kw)
    return _kernel_result(outer, path, start_method)


def _kernel_result(outer, path: str, start_method: Optional[str]):
    """A RunResult made of what the kernel recorded (its exception, loader events, workers), inside the
    outer run's limits, outcome and stderr (the kernel's and its workers' fd 2 go there)."""
    from ..runner.result import ExceptionInfo, ProcessInfo, RunResult

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
        with open(os.path.join(RUN_DIR, "emitted.jsonl"), "a", encoding="utf-8") as fh:
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
    "exc": read_json("exc.json") if state["error"] == "cell" else None,
    "procs": read_jsonl("procs.jsonl"),
    "exits": read_json("exits.json") or {},
    "stdout": "".join(t for n, t in streams if n == "stdout"),
    "stderr": "".join(t for n, t in streams if n == "stderr"),
}
line = json.dumps({"notebook": record}, default=repr) + "\n"
with open(os.path.join(RUN_DIR, "emitted.jsonl"), "a", encoding="utf-8") as fh:
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

    def chain(exc):
        out, seen, link = [], set(), None
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False))
            out.append({"type": type(exc).__qualname__, "module": type(exc).__module__, "message": str(exc),
                        "link": link, "traceback": tb[-6000:]})
            if exc.__cause__ is not None:
                exc, link = exc.__cause__, "cause"
            elif exc.__context__ is not None and not exc.__suppress_context__:
                exc, link = exc.__context__, "context"
            else:
                exc = None
        return out

    original_start = process.BaseProcess.start

    def start(self):
        target = getattr(self, "_target", None)
        original_start(self)
        if os.getpid() != main_pid:
            return
        started.append(self)
        append("procs.jsonl", {"pid": self.pid, "name": self.name, "t": time.time(),
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
                append("loader.jsonl", {"event": "init_error", "t": time.time(), "chain": chain(exc)}, run_dir)
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
            append("loader.jsonl", {"event": "iter", "t": time.time(), "iter": counter[0],
                                    "num_workers": loader.num_workers, "timeout": loader.timeout,
                                    "start_method": m, "batch_size": loader.batch_size,
                                    "prefetch_factor": loader.prefetch_factor, "pin_memory": loader.pin_memory,
                                    "dataset": type(loader.dataset).__module__ + "."
                                    + type(loader.dataset).__qualname__}, run_dir)

        def progress(self):
            self._lab_last = time.time()
            append("loader.jsonl", {"event": "progress", "t": self._lab_last, "iter": self._lab_iter,
                                    "batches": self._lab_batches}, run_dir)

        def __next__(self):
            try:
                data = original_next(self)
            except StopIteration:
                if hasattr(self, "_lab_iter"):
                    progress(self)
                raise
            except BaseException as exc:
                append("loader.jsonl", {"event": "error", "t": time.time(), "chain": chain(exc)}, run_dir)
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
                    append("loader.jsonl", {"event": "patch_failed", "error": repr(exc)})

            spec.loader.exec_module = exec_module
            return spec

    if "torch.utils.data.dataloader" in sys.modules:
        patch(sys.modules["torch.utils.data.dataloader"])
    else:
        sys.meta_path.insert(0, Finder())

    def post_run_cell(result):
        err = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        if err is not None:
            with open(os.path.join(evid, "exc.json"), "w", encoding="utf-8") as fh:
                json.dump(chain(err), fh, default=repr)
        exits()

    get_ipython().events.register("post_run_cell", post_run_cell)  # noqa: F821


__labutils_instrument()
del __labutils_instrument
'''
