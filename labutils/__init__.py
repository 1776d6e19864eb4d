"""DataLoader Crash Lab helpers: isolated runs, diagnosis, machine checks and reusable fixes.

The public face, by job (each name is imported on first use, PEP 562, so ``import labutils`` inside an
isolated cell that only calls :func:`emit` costs almost nothing):

* run learner code isolated: :func:`run_isolated`, the ``%%isolate`` magic (``%load_ext labutils``),
  :func:`emit`, :class:`RunResult`, :class:`StopRun`, :class:`IsolationError`; leak checks
  :func:`find_strays`, :func:`leftover_shm`, :func:`private_shm_support`;
* name the cause: :func:`explain` -> :class:`Diagnosis`; what blocks pickling: :func:`find_unpicklable`;
* check the machine: :func:`doctor`, :func:`shm_budget`;
* the interactive lab: :func:`lab`; the start-method switch: :mod:`startmethod`.

Everything else is imported from its module, one path per name: the meters and fixes the lessons use
from ``labutils.kit.<module>`` (``measure``, ``deaths``, ``fixes``, ...), the runner's parts from
``labutils.runner.<module>`` (a new run limit is one row of ``labutils.runner.spec.OPTIONS``), the probes from
``labutils.machine.<module>``.
"""

import importlib
import os
import sys

from . import _lazy
from .runner import startmethod

#: name -> the module (below this package) that defines it
_FACE = {
    "run_isolated": "runner.isolate", "find_strays": "runner.ownership", "leftover_shm": "runner.ownership",
    "private_shm_support": "runner.isolate", "IsolationError": "runner.isolate",
    "emit": "runner.channel", "RunResult": "runner.result", "StopRun": "runner.spec",
    "explain": "diagnosis.diagnose", "Diagnosis": "diagnosis.diagnose",
    "find_unpicklable": "diagnosis.pickling",
    "doctor": "machine.doctor", "shm_budget": "machine.doctor",
}
_PACKAGES = ("commands", "diagnosis", "kit", "lab", "machine", "runner", "scenarios")

__all__ = [*sorted(_FACE), "lab", "load_ipython_extension", "startmethod"]


def __getattr__(name: str):
    if name in _FACE:
        value = getattr(importlib.import_module(f".{_FACE[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _PACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'labutils' has no attribute {name!r}")


def __dir__():
    return sorted({*__all__, *_PACKAGES})


def _explain(result):
    """:func:`labutils.diagnosis.diagnose.explain`, imported on first use (see :func:`labutils._lazy.explain`)."""
    from .diagnosis.diagnose import explain

    return explain(result)


_lazy.explain = _explain


def load_ipython_extension(ipython) -> None:
    """``%load_ext labutils`` registers the ``%%isolate`` cell magic, shows every RunResult as the lab's card
    (also in a shell made after the import), and applies the start-method switch."""
    from .lab.magic import load_ipython_extension as _load

    startmethod.apply_requested()
    _show_cards(ipython)
    _load(ipython)


def _kernel_shell():
    """The IPython shell this interpreter runs (a notebook kernel), or None."""
    ipython = sys.modules.get("IPython")
    try:
        return ipython.get_ipython() if ipython is not None else None
    except Exception:  # noqa: BLE001 - an IPython in a strange state: not a kernel of the lab
        return None


def _show_cards(shell) -> None:
    """In a kernel, a RunResult shows as the lab's card (its diagnosis attached by ``labutils.lab.card``), with
    or without ``%load_ext labutils``; registered by name, so nothing is imported until a result is shown."""
    def html(result):
        from .lab.card import card_html

        return card_html(result)

    shell.display_formatter.formatters["text/html"].for_type_by_name("labutils.runner.result", "RunResult", html)


def _started_by_a_run() -> bool:
    """Whether one of the lab's isolated runs started this interpreter (its environment names the runner),
    other than the run's own main process (and its forks), whose bootstrap has decided the start method."""
    from .runner.warm import RUNNER_ENV

    return bool(os.environ.get(RUNNER_ENV)) and not startmethod.decided()


# The lab's start-method switch (LABUTILS_START_METHOD): a notebook kernel gets the same default as every
# run, and so does a process that a run starts with its own interpreter (torchrun's ranks, a script run with
# subprocess), as a newer Python would give them. The run's own main process gets it from its bootstrap,
# the lab's pytest plugin in its own process. A learner's script run outside the lab keeps Python's default.
# Nothing is asked for (the usual case): nothing to decide, and nothing more is imported.
_SHELL = _kernel_shell()
if _SHELL is not None and hasattr(_SHELL, "display_formatter"):
    _show_cards(_SHELL)
if startmethod.requested():
    if _SHELL is not None:
        startmethod.apply_requested()
    elif _started_by_a_run():  # a script as __main__, as in the bootstrap: 3.14's fork server would preload it
        from .runner.child import when_imported

        startmethod.apply_requested(emulate_preload=when_imported)
