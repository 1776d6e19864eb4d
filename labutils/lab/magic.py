"""The ``%%isolate`` cell magic: run a cell's code in a fresh process with :func:`run_isolated`.

Usage (after ``%load_ext labutils``)::

    %%isolate -o broken --start-method spawn --timeout 30 --memory-budget 600M
    ...the cell's code, run like ``python lab_cell.py``...

The result is shown as a card and, with ``-o NAME``, stored in the notebook's namespace for assertion
cells. ``--notebook-main`` runs the cell in a ``__main__`` without a file, like a notebook itself.
``--hide-cause`` shows the evidence first and folds the lab's diagnosis into a "show the lab's diagnosis"
block below it, so the learner predicts the cause before reading it (:mod:`labutils.lab.card`).
The run options are the rows of :data:`labutils.runner.spec.OPTIONS` that have a flag (one table for the
magic, both command lines and ``run_isolated``). A bad option is one line naming the option as typed
(IPython's UsageError, no traceback).
"""

from __future__ import annotations

import shlex

from ..runner.isolate import IsolationError, run_isolated
from ..runner.spec import add_run_options, run_options
from . import card


def _parser():
    """The magic's options: its own three, then every run option of the table with a flag
    (:data:`labutils.runner.spec.OPTIONS`), built on IPython's magic-argument parser."""
    from IPython.core.magic_arguments import MagicArgumentParser

    class Parser(MagicArgumentParser):
        def error(self, message):  # one line naming the option as typed, and the options there are
            usage = " ".join(self.format_usage().split())
            raise IsolationError(f"%%isolate: {message}. Options: {usage}")

    p = Parser(prog="%%isolate", add_help=False, description="Run the cell's code in a fresh process.")
    p.add_argument("-o", "--out", metavar="NAME", help="store the RunResult under this name")
    p.add_argument("-q", "--quiet", action="store_true", help="do not display the result card")
    p.add_argument("--hide-cause", action="store_true",
                   help="fold the lab's diagnosis below the evidence (predict the cause first)")
    add_run_options(p)
    return p


def isolate_cell(line: str, cell: str, user_ns: dict):
    """Parse the magic's options, run the cell isolated, store the RunResult; return the card to show
    (None with ``--quiet``)."""
    try:
        words = shlex.split(line)
    except ValueError as exc:  # an unclosed quote
        raise IsolationError(f"%%isolate: cannot read the options ({exc}): close the quote") from None
    opts = _parser().parse_args(words)
    if opts.out is not None and not opts.out.isidentifier():
        raise IsolationError(f"%%isolate: -o {opts.out!r} is not a valid Python name")
    try:
        result = run_isolated(cell, **run_options(opts))
    except IsolationError as exc:  # name the option as typed (the table's flag), not the Python argument
        raise IsolationError(f"%%isolate: {exc.for_option()}") from None
    except (ValueError, TypeError) as exc:  # a value the runner could not take, said in one line
        raise IsolationError(f"%%isolate: {exc}") from None
    if opts.out:
        user_ns[opts.out] = result
    return None if opts.quiet else card.Card(result, hide_cause=opts.hide_cause)


def load_ipython_extension(ipython) -> None:
    """Register ``%%isolate`` (called by ``%load_ext labutils``)."""
    def isolate(line, cell):
        from IPython.core.error import UsageError

        try:
            shown = isolate_cell(line, cell, ipython.user_ns)
        except IsolationError as exc:
            raise UsageError(str(exc)) from None  # IPython shows the message alone, no traceback
        if shown is not None:
            from IPython.display import display

            display(shown)

    isolate.__doc__ = __doc__.split("\n\n")[0] + "\n\n" + _parser().format_help()  # what %%isolate? shows
    ipython.register_magic_function(isolate, magic_kind="cell", magic_name="isolate")
