"""``python -m labutils diagnose [OPTIONS] SCRIPT|NOTEBOOK [ARGS...]``: run it isolated and name the cause.

A script runs unchanged in a fresh process under the limits of :func:`labutils.run_isolated`; a notebook runs
cell by cell in a Jupyter kernel inside that run (its classes as unimportable for spawn workers as in
JupyterLab), and the report names the failing cell. Only ``--stall`` or ``--timeout`` stops a run early.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

from ..diagnosis.diagnose import explain_log
from ..diagnosis.logread import LogError, read_logs
from ..runner.isolate import IsolationError, run_isolated
from ..runner.notebook import run_notebook
from ..runner.spec import add_run_options, whole_number
from ..runner.torchrun import run_torchrun

PROG = "python -m labutils diagnose"
DEFAULT_STALL = 300.0
DEFAULT_TIMEOUT = None  # no total limit: a long healthy run is not a hang
#: run_isolated's options this command takes as they are (the flags and checks of runner.spec's table)
_RUN_OPTIONS = ("timeout", "memory_budget", "shm_size", "nofile", "max_processes", "start_method")

_EPILOG = """a log: `python -m labutils diagnose --log FILE [FILE ...]` (- for standard input) names the cause
from the text a job printed, without running anything (see --log --help).

torchrun: `python -m labutils diagnose --torchrun --nproc-per-node 2 train.py ARGS` launches
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
    p.add_argument("--stall", metavar="SECONDS", type=float, default=None,
                   help=f"stop the run when no batch is delivered for this long while DataLoader workers are "
                        f"alive, and diagnose a hang with the stacks of the stuck processes (default "
                        f"{DEFAULT_STALL:g}; 0 turns it off)")
    # checked by RunSpec.build, whose error names the flag (a notebook's kernel takes the start method too)
    add_run_options(p, _RUN_OPTIONS, timeout=DEFAULT_TIMEOUT)
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
    tr.add_argument("--nproc-per-node", metavar="N", type=whole_number(1), default=None,
                    help="ranks on this machine (with --torchrun; default 1, as torchrun)")
    tr.add_argument("--max-restarts", metavar="K", type=whole_number(0), default=None,
                    help="torchrun's --max-restarts: restart every rank up to K times after a failure "
                         "(with --torchrun; default 0)")
    p.add_argument("script", metavar="SCRIPT", help="a Python script, or a notebook (.ipynb)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for the script")
    return p


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
    kw = {name: getattr(args, name) for name in _RUN_OPTIONS if hasattr(args, name)}  # those given
    stall = DEFAULT_STALL if args.stall is None else args.stall
    # under torchrun the ranks' batches are not counted: a stall watch would stop a healthy launch
    kw["stall"] = stall if stall and not args.torchrun else None
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


def _diagnosis_dict(d, optional: tuple) -> dict:
    """A ``--json`` object's keys from the diagnosis ``d``, with each name of ``optional`` that it has."""
    out = {"cause": d.cause, "summary": d.summary, "confidence": d.confidence, "recovered": d.recovered,
           "evidence": d.evidence, "source": d.source, "proves": d.proves, "cannot_prove": d.cannot_prove,
           "decide_with": d.decide_with,
           "fixes": [{"text": f.text, "notebook": f.notebook, "path": f.path} for f in d.fixes]}
    out.update({name: getattr(d, name) for name in optional if getattr(d, name, None)})
    return out


def report_dict(result, script: str, script_args: Sequence[str]) -> dict:
    """The ``--json`` object for a run: the failing process's place in the tree, the texts the cause does
    not explain and, under torchrun, the first failed rank with every failure, where there are any."""
    out = _diagnosis_dict(result.diagnosis, ("process", "unexplained", "tree", "launch"))
    out.update({
        "outcome": result.outcome, "exit": result.exit_text, "returncode": result.returncode,
        "signal": result.signal, "reason": result.reason,
        "workers": [{"pid": w.pid, "role": w.role, "exitcode": w.exitcode, "signal": w.signal, "status": w.status,
                     "killed_by_watchdog": w.killed_by_watchdog, "killed_by_kernel_oom": w.killed_by_kernel_oom,
                     "peak_rss": w.peak_rss} for w in result.workers],
        "exceptions": [{"type": e.type, "message": e.message, "link": e.link} for e in result.exceptions],
        "loader_errors": [[{"type": e.type, "message": e.message, "link": e.link} for e in chain]
                          for chain in result.loader_errors],
        "watchdog_kills": result.watchdog_kills,
        "memory_limit": result.memory_limit, "stall": result.stall, "launcher": result.launcher,
        "wall_time": round(result.wall_time, 3),
        "script": script, "args": list(script_args), "options": result.options,
        "stdout": result.stdout, "stderr": result.stderr,
    })
    cell = getattr(result, "failing_cell", None)
    if cell is not None or script.endswith(".ipynb"):
        out["cell"] = cell
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


LOG_USAGE = f"usage: {PROG} --log FILE [FILE ...] [--json]   (FILE - reads standard input)"


def _log_mode(argv: Sequence[str]) -> bool:
    """``--log`` among the options (before a SCRIPT, if any)."""
    for arg in argv:
        if arg == "--log" or arg.startswith("--log="):
            return True
        if not arg.startswith("-"):
            return False
    return False


def log_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=f"{PROG} --log", description="Name the cause of a DataLoader failure from the text a job "
                "printed: its stdout, its stderr, dmesg output, kubectl describe pod, a Slurm .err file (each "
                "FILE is evidence of the same job; - reads standard input). The report says what the text "
                "proves, what it cannot, and the command that decides it on the job's machine.")
    p.add_argument("--log", metavar="FILE", nargs="+", required=True, help="log files of one job (- for stdin)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    return p


def log_report_dict(d, log) -> dict:
    """The ``--json`` object for a log: a run's diagnosis keys, with ``source: "log"`` and what was read."""
    return {**_diagnosis_dict(d, ("unexplained", "launch")),
            "files": list(log.names), "bytes_read": log.bytes_read, "lines_read": log.lines_read}


def log_main(argv: Sequence[str]) -> int:
    """``diagnose --log FILE [FILE ...]``: 0 when no DataLoader failure is named, 1 when a cause is, 2 for a
    usage error or a log that cannot be read (one line)."""

    if any(a in ("-h", "--help") for a in argv):
        log_parser().print_help()
        return 0
    try:
        args = log_parser().parse_args(list(argv))
    except UsageError as exc:
        return _fail(exc, usage=LOG_USAGE)
    try:
        log = read_logs(args.log)
    except LogError as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    d = explain_log(log)
    _report(json.dumps(log_report_dict(d, log), default=repr) if args.json
            else f"diagnose --log {' '.join(log.names)}:\n{d}")
    return 0 if d.cause == "ok" or (d.cause == "unknown" and d.summary.startswith("no DataLoader failure")) else 1


def _report(text: str) -> None:
    """Print the report; a reader that left (``diagnose ... | head``) is not an error of the run."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _fail(message, status: int = 2, usage: str = "") -> int:
    """Say why on stderr in one line (and the usage, for a usage error); return the exit status."""
    print(f"labutils diagnose: {message}" + (f"\n{usage}" if usage else ""), file=sys.stderr)
    return status


def diagnose_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m labutils diagnose``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if _log_mode(argv):
        return log_main(argv)
    if argv and argv[0] in ("-h", "--help"):
        build_parser().print_help()
        return 0
    try:
        args = build_parser().parse_args(argv)
        kind = _check_script(args.script)
        if kind == "notebook" and args.stdin_main:
            raise UsageError("--stdin-main is for scripts; a notebook always runs in a kernel whose __main__ "
                             "has no file")
        if kind == "notebook" and args.args:
            raise UsageError("a notebook takes no arguments")
        _check_torchrun(args, kind)
        kw = _limits(args)
    except UsageError as exc:
        return _fail(exc, usage=f"usage: {PROG} [OPTIONS] SCRIPT|NOTEBOOK [ARGS...]   (--help for the options)")
    except SystemExit as exc:  # argparse's own --help inside the options
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2

    # The monitor only needs to sample often when it enforces a memory budget; otherwise a slower
    # pace keeps the CPU it takes from the script (on 2 cores) out of the measured overhead.
    interval = 0.05 if "memory_budget" in kw else 0.5
    try:
        if kind == "notebook":
            result = run_notebook(args.script, kw, interval)
        elif args.torchrun:
            result = run_torchrun(args.script, args.args, nproc_per_node=args.nproc_per_node or 1,
                                  max_restarts=args.max_restarts or 0, sample_interval=interval, **kw)
        else:
            result = run_isolated(file=args.script, argv=args.args, sample_interval=interval, **kw)
    except IsolationError as exc:
        flag = "--" + exc.argument.replace("_", "-") if getattr(exc, "argument", None) else None
        return _fail(exc.for_option(flag) if flag else exc)
    except KeyboardInterrupt:
        return _fail("interrupted; the run was stopped", 130)
    if result.outcome == "unsupported":
        if args.json:
            print(json.dumps({"cause": "unsupported", "summary": result.reason, "evidence": [], "fixes": [],
                              "outcome": result.outcome, "exit": result.exit_text, "workers": [],
                              "memory_limit": result.memory_limit}))
        return _fail(f"the run could not start: {result.reason}")
    _report(json.dumps(report_dict(result, args.script, args.args), default=repr) if args.json
            else _report_text(result, args.script, args.quiet))
    return 0 if result.diagnosis.cause == "ok" else 1
