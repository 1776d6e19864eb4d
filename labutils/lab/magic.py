"""The ``%%isolate`` cell magic: run a cell's code in a fresh process with :func:`run_isolated`.

Usage (after ``%load_ext labutils``)::

    %%isolate -o broken --start-method spawn --timeout 30 --memory-budget 600M
    ...the cell's code, run like ``python lab_cell.py``...

The result is shown as a card and, with ``-o NAME``, stored in the notebook's namespace for assertion
cells. ``--notebook-main`` runs the cell in a ``__main__`` without a file, like a notebook itself.
``--hide-cause`` shows the evidence first and folds the lab's diagnosis into a "show the lab's diagnosis"
block below it, so the learner predicts the cause before reading it (:mod:`labutils.lab.card`).
A bad option is one line naming the option as typed (IPython's UsageError, no traceback).
"""

from __future__ import annotations

import argparse
import shlex

from ..runner.isolate import IsolationError, run_isolated
from . import card


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would exit the kernel's magic with SystemExit(2)
        usage = " ".join(self.format_usage().split())  # one line, however wide the terminal
        raise IsolationError(f"%%isolate: {message}. Options: {usage}")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%%isolate", add_help=False)
    p.add_argument("-o", "--out", metavar="NAME", help="store the RunResult under this name")
    p.add_argument("--start-method", choices=["fork", "spawn", "forkserver"])
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--memory-budget")
    p.add_argument("--memory-enforcement", choices=["auto", "kernel", "watchdog"])
    p.add_argument("--stall", type=float, metavar="SECONDS")
    p.add_argument("--shm-size")
    p.add_argument("--nofile", type=int)
    p.add_argument("--max-processes", type=int)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--notebook-main", action="store_true")
    p.add_argument("--memory-detail", action="store_true")
    p.add_argument("--launcher", choices=["auto", "warm", "cold"],
                   help="cold: a fresh interpreter; auto (default): fork it from the warm template where equal")
    p.add_argument("-q", "--quiet", action="store_true", help="do not display the result card")
    p.add_argument("--hide-cause", action="store_true",
                   help="fold the lab's diagnosis below the evidence (predict the cause first)")
    return p


_OPTION_OF = {name: "--" + name.replace("_", "-") for name in (
    "start_method", "timeout", "memory_budget", "memory_enforcement", "stall", "shm_size", "nofile",
    "max_processes")}


def isolate_cell(line: str, cell: str, user_ns: dict):
    """Parse the magic's options, run the cell isolated, store the RunResult; return the card to show
    (None with ``--quiet``)."""
    try:
        words = shlex.split(line)
    except ValueError as exc:  # an unclosed quote
        raise IsolationError(f"%%isolate: cannot read the options ({exc}): close the quote") from None
    opts = _parser().parse_args(words)
    env = {}
    for item in opts.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise IsolationError(f"%%isolate: --env {item!r} must look like KEY=VALUE")
        env[key] = value
    if opts.out is not None and not opts.out.isidentifier():
        raise IsolationError(f"%%isolate: -o {opts.out!r} is not a valid Python name")
    try:
        result = run_isolated(cell, start_method=opts.start_method, timeout=opts.timeout,
                              memory_budget=opts.memory_budget, shm_size=opts.shm_size, nofile=opts.nofile,
                              env=env, notebook_main=opts.notebook_main, memory_detail=opts.memory_detail,
                              memory_enforcement=opts.memory_enforcement, stall=opts.stall,
                              launcher=opts.launcher,
                              **({"max_processes": opts.max_processes} if opts.max_processes is not None else {}))
    except IsolationError as exc:
        if exc.argument in _OPTION_OF:  # name the option the user typed, not the Python argument
            raise IsolationError(f"%%isolate: {exc.for_option(_OPTION_OF[exc.argument])}") from None
        raise IsolationError(f"%%isolate: {exc}") from None
    except (ValueError, TypeError) as exc:  # a value the runner could not take, said in one line
        raise IsolationError(f"%%isolate: {exc}") from None
    if opts.out:
        user_ns[opts.out] = result
    return None if opts.quiet else card.Card(result, hide_cause=opts.hide_cause)


def load_ipython_extension(ipython) -> None:
    """Register ``%%isolate`` and show every RunResult as the lab's card (called by ``%load_ext labutils``)."""
    card.register(ipython)

    def isolate(line, cell):
        from IPython.core.error import UsageError

        try:
            shown = isolate_cell(line, cell, ipython.user_ns)
        except IsolationError as exc:
            raise UsageError(str(exc)) from None  # IPython shows the message alone, no traceback
        if shown is not None:
            from IPython.display import display

            display(shown)

    ipython.register_magic_function(isolate, magic_kind="cell", magic_name="isolate")
