"""The lab's start-method switch for the plain-python side of the parity check.

``tests/parity/harness.py`` puts this folder on ``PYTHONPATH`` (last) when a case runs under a start method
other than the machine's default. ``LABUTILS_START_METHOD`` is then applied exactly as an isolated run's
bootstrap applies it (``startmethod.apply_requested``, with ``child.when_imported``, both loaded by path), so plain
python and the lab run the script under the same default. The next ``sitecustomize`` on ``sys.path`` (the
suite's ledger) still runs.
"""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _chain():
    """The next ``sitecustomize`` after this folder on ``sys.path`` (the suite's ledger puts its folder before
    this one; its own chain then comes here, and this one must not go back to it)."""
    places = [os.path.abspath(p or ".") for p in sys.path]
    rest = sys.path[places.index(_here) + 1:] if _here in places else []
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if not getattr(sys, "_parity_site_done", False):
    sys._parity_site_done = True
    if os.environ.get("LABUTILS_START_METHOD") and os.environ.get("PARITY_STARTMETHOD_PY"):
        before = set(sys.modules)
        child = _load("_parity_child", os.path.join(os.path.dirname(os.environ["PARITY_STARTMETHOD_PY"]), "child.py"))
        for name in set(sys.modules) - before:  # child.py's own imports (json): the script imports them itself, as
            del sys.modules[name]  # python's, where it does (the bootstrap moves them there: _follow_imports)
        _load("_parity_startmethod", os.environ["PARITY_STARTMETHOD_PY"]).apply_requested(child.when_imported)
    _chain()
