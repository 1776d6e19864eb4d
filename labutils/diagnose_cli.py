"""``python -m labutils diagnose [OPTIONS] SCRIPT [ARGS...]``: run a training script isolated and name the cause.

The script runs unchanged in a fresh process under the same limits as :func:`labutils.run_isolated`.
Its own output is kept and shown. Even a script that catches the DataLoader error and exits 0 is
diagnosed from what happened (every exception that escaped a DataLoader iterator is recorded, and so
is every worker's exit status). Options come before SCRIPT; everything after SCRIPT is the script's.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Optional, Sequence

USAGE = """usage: python -m labutils diagnose [OPTIONS] SCRIPT [ARGS...]

Run a training script isolated (a fresh process; the limits below apply to it only) and name the
cause of its DataLoader failure. Options go before SCRIPT; everything after SCRIPT is passed to it.

options:
  --timeout SECONDS        kill the run after this long (default 300); reported as a hang
  --memory-budget SIZE     SIGKILL any process of the run whose RSS exceeds SIZE (e.g. 600M), as the
                           kernel OOM killer would
  --shm-size SIZE          run with a private /dev/shm of SIZE (e.g. 8M; Linux, needs mount namespaces)
  --nofile N               RLIMIT_NOFILE soft limit of the run
  --start-method METHOD    fork, spawn or forkserver for the run's multiprocessing
  --stdin-main             run the script as if pasted into a notebook / python - (its __main__ has no
                           file, so spawn/forkserver workers cannot import classes defined in it)
  --json                   print one JSON object (cause, summary, evidence, fixes, outcome, exit,
                           workers, ...) instead of the report
  --quiet                  do not echo the script's own output in the report
  -h, --help               show this help

exit status: 0 when the run was diagnosed `ok`, 1 when a cause was found, 2 for a usage error
(missing file, not a Python script, bad option)."""

_VALUE_OPTIONS = {"--timeout", "--memory-budget", "--shm-size", "--nofile", "--start-method"}
_FLAG_OPTIONS = {"--stdin-main", "--json", "--quiet"}
DEFAULT_TIMEOUT = 300.0


class UsageError(Exception):
    pass


def _parse(argv: Sequence[str]) -> tuple:
    """Split argv into (options, script, script_args). Options stop at the first non-option (SCRIPT)."""
    opts: dict = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        if arg in ("-h", "--help"):
            opts["help"] = True
            i += 1
            continue
        name, eq, value = arg.partition("=")
        if name in _FLAG_OPTIONS:
            if eq:
                raise UsageError(f"option {name} takes no value")
            opts[name[2:].replace("-", "_")] = True
            i += 1
            continue
        if name in _VALUE_OPTIONS:
            if not eq:
                if i + 1 >= len(args):
                    raise UsageError(f"option {name} needs a value")
                value = args[i + 1]
                i += 1
            opts[name[2:].replace("-", "_")] = value
            i += 1
            continue
        raise UsageError(f"unknown option {arg!r} (options go before SCRIPT; see --help)")
    if opts.get("help"):
        return opts, None, []
    if i >= len(args):
        raise UsageError("no SCRIPT given")
    return opts, args[i], args[i + 1:]


def _limits(opts: dict) -> dict:
    from ._sizes import parse_size

    kw: dict = {"timeout": DEFAULT_TIMEOUT}
    if "timeout" in opts:
        try:
            kw["timeout"] = float(opts["timeout"])
        except ValueError:
            raise UsageError(f"--timeout {opts['timeout']!r}: give a number of seconds") from None
        if not kw["timeout"] > 0:
            raise UsageError("--timeout must be positive")
    for name in ("memory_budget", "shm_size"):
        if name in opts:
            try:
                parse_size(opts[name])
            except (ValueError, TypeError) as exc:
                raise UsageError(f"--{name.replace('_', '-')} {opts[name]!r}: {exc}") from None
            kw[name] = opts[name]
    if "nofile" in opts:
        try:
            kw["nofile"] = int(opts["nofile"])
        except ValueError:
            raise UsageError(f"--nofile {opts['nofile']!r}: give an integer") from None
        if kw["nofile"] < 16:
            raise UsageError("--nofile must be at least 16 (Python itself needs a few descriptors)")
    if "start_method" in opts:
        if opts["start_method"] not in ("fork", "spawn", "forkserver"):
            raise UsageError(f"--start-method {opts['start_method']!r}: use fork, spawn or forkserver")
        kw["start_method"] = opts["start_method"]
    if opts.get("stdin_main"):
        kw["notebook_main"] = True
    return kw


def _check_script(script: str) -> str:
    if not os.path.exists(script):
        raise UsageError(f"{script}: no such file")
    if os.path.isdir(script):
        raise UsageError(f"{script}: is a directory, give a Python script")
    try:
        with open(script, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise UsageError(f"{script}: cannot read it ({exc.strerror})") from None
    if b"\x00" in data[:8192]:
        raise UsageError(f"{script}: not a Python script (binary file)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{script}: not a Python script (not UTF-8 text)") from None
    try:
        compile(text, script, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise UsageError(f"{script}: not a Python script (syntax error at line {exc.lineno}: {exc.msg})") \
            from None
    except ValueError as exc:
        raise UsageError(f"{script}: not a Python script ({exc})") from None
    return script


def _workers(result) -> list:
    out = []
    for w in result.workers:
        out.append({"pid": w.pid, "role": w.role, "exitcode": w.exitcode, "signal": w.signal,
                    "status": w.status, "killed_by_watchdog": w.killed_by_watchdog,
                    "peak_rss": w.peak_rss})
    return out


def report_dict(result, script: str, script_args: Sequence[str]) -> dict:
    """The ``--json`` object for a run."""
    d = result.diagnosis
    return {
        "cause": d.cause, "summary": d.summary, "confidence": d.confidence,
        "evidence": d.evidence,
        "fixes": [{"text": f.text, "notebook": f.notebook, "path": f.path} for f in d.fixes],
        "outcome": result.outcome, "exit": result.exit_text, "returncode": result.returncode,
        "signal": result.signal, "reason": result.reason,
        "workers": _workers(result),
        "exceptions": [{"type": e.type, "message": e.message, "link": e.link} for e in result.exceptions],
        "loader_errors": [[{"type": e.type, "message": e.message, "link": e.link} for e in chain]
                          for chain in result.loader_errors],
        "watchdog_kills": result.watchdog_kills,
        "wall_time": round(result.wall_time, 3),
        "script": script, "args": list(script_args), "options": result.options,
        "stdout": result.stdout, "stderr": result.stderr,
    }


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
    if result.reason:
        lines.append(f"reason: {result.reason}")
    lines.append(str(d))
    return "\n".join(lines)


def diagnose_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m labutils diagnose``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        opts, script, script_args = _parse(argv)
        if opts.get("help"):
            print(USAGE)
            return 0
        kw = _limits(opts)
        _check_script(script)
    except UsageError as exc:
        print(f"labutils diagnose: {exc}", file=sys.stderr)
        print("usage: python -m labutils diagnose [OPTIONS] SCRIPT [ARGS...]   (--help for the options)",
              file=sys.stderr)
        return 2

    from .isolate import IsolationError, run_isolated

    try:
        # The monitor only needs to sample often when it enforces a memory budget; otherwise a slower
        # pace keeps the CPU it takes from the script (on 2 cores) out of the measured overhead.
        interval = 0.05 if "memory_budget" in kw else 0.5
        result = run_isolated(file=script, argv=script_args, sample_interval=interval, **kw)
    except IsolationError as exc:
        print(f"labutils diagnose: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("labutils diagnose: interrupted; the run was stopped", file=sys.stderr)
        return 130
    if result.outcome == "unsupported":
        print(f"labutils diagnose: the run could not start: {result.reason}", file=sys.stderr)
        if opts.get("json"):
            print(json.dumps({"cause": "unsupported", "summary": result.reason, "evidence": [],
                              "fixes": [], "outcome": result.outcome, "exit": result.exit_text,
                              "workers": []}))
        return 2
    if opts.get("json"):
        print(json.dumps(report_dict(result, script, script_args), default=repr))
    else:
        print(_report_text(result, script, bool(opts.get("quiet"))))
    return 0 if result.diagnosis.cause == "ok" else 1
