"""Submodules on first use (PEP 562): ``labutils.kit.measure.shm_left(...)`` works after a plain ``import
labutils``, and a package's ``__init__`` imports nothing until a name is asked for."""

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
