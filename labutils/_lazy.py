"""Submodules on first use (PEP 562): ``labutils.kit.measure.shm_left(...)`` works after a plain ``import
labutils``, and a package's ``__init__`` imports nothing until a name is asked for. Also the one piece of
work a layer hands down to the record below it, loaded on first use: a run's diagnosis (:func:`explain`)."""

from __future__ import annotations

import importlib


def submodule_getattr(package: str):
    """A module ``__getattr__`` for ``package`` that imports its submodule of that name."""

    def __getattr__(name: str):
        if not name.startswith("__"):
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def explain(result):
    """The diagnosis of a RunResult, which its ``diagnosis`` property asks for. The runner sits below the
    diagnosis and never imports it: ``labutils/__init__.py`` (imported before any module of the package)
    replaces this stand-in with :func:`labutils.diagnosis.diagnose.explain`, imported on first use."""
    raise RuntimeError("no diagnosis is attached to RunResult: labutils/__init__.py attaches it on import")
