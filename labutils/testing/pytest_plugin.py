"""pytest plugin of the lab (loaded by ``-p labutils.testing.pytest_plugin`` in pyproject.toml).

* ``--lab-start-method M`` runs the whole suite (the notebooks' kernels and every isolated run) under the
  default start method ``M`` (``fork``, ``forkserver`` or ``spawn``), through ``LABUTILS_START_METHOD``:
  this is how the lab is tested as Python 3.14 (forkserver) and macOS (spawn) see it.
* ``--lab-also-start-method M`` (repeatable; the ``lab_also_start_methods`` ini value sets the default)
  collects every notebook a second time, whose kernel and runs use the default ``M``, and gives tests
  that take the ``lab_start_method`` fixture one more parameter. ``--lab-also-start-method none`` turns
  the extra pass off.
"""

from __future__ import annotations

import os

import pytest

from ..runner import startmethod


def pytest_addoption(parser) -> None:
    group = parser.getgroup("labutils", "DataLoader Crash Lab")
    group.addoption("--lab-start-method", choices=startmethod.METHODS, default=None,
                    help="default start method for the kernel and every isolated run (LABUTILS_START_METHOD)")
    group.addoption("--lab-also-start-method", action="append", default=None, metavar="M",
                    help="also run every notebook (and start-method tests) under default M; 'none' for no "
                         "extra pass")
    group.addoption("--lab-repeat", type=int, default=1, metavar="N",
                    help="run each scenario's broken script N times (the cause must not depend on timing); "
                         "1 by default, 3 for a nightly job")
    parser.addini("lab_also_start_methods", "start methods for the extra notebook pass", type="args",
                  default=[])


def _main_method(config) -> str:
    return config.getoption("--lab-start-method") or startmethod.requested() or startmethod.python_default()


def _also_methods(config) -> list:
    given = config.getoption("--lab-also-start-method")
    values = given if given is not None else config.getini("lab_also_start_methods")
    out = []
    for value in values:
        for item in str(value).split(","):
            item = item.strip()
            if not item or item == "none":
                continue
            if item not in startmethod.METHODS:
                raise pytest.UsageError(f"--lab-also-start-method {item!r}: use one of "
                                        f"{', '.join(startmethod.METHODS)} or none")
            if item != _main_method(config) and item not in out:
                out.append(item)
    return out


def pytest_configure(config) -> None:
    method = config.getoption("--lab-start-method")
    if method:
        os.environ[startmethod.ENV] = method  # inherited by every kernel and isolated run
    startmethod.apply_requested()
    config._lab_also = _also_methods(config)


def pytest_report_header(config) -> str:
    also = ", ".join(config._lab_also) or "none"
    return f"labutils: default start method {_main_method(config)}; extra notebook pass: {also}"


def pytest_collect_file(file_path, parent):
    opt = parent.config.option
    if file_path.suffix != ".ipynb" or not (getattr(opt, "nbval", False) or getattr(opt, "nbval_lax", False)):
        return None
    methods = getattr(parent.config, "_lab_also", [])
    if not methods:
        return None
    from nbval.plugin import IPyNbFile

    class StartMethodNotebook(IPyNbFile):
        """The same notebook, its kernel started with LABUTILS_START_METHOD set."""

        lab_start_method = None

        def setup(self):
            old = os.environ.get(startmethod.ENV)
            os.environ[startmethod.ENV] = self.lab_start_method
            try:
                super().setup()  # the kernel starts here and inherits the variable
            finally:
                if old is None:
                    os.environ.pop(startmethod.ENV, None)
                else:
                    os.environ[startmethod.ENV] = old

    class StartMethodPass(pytest.File):
        """Holds the extra copies of one notebook, one per start method."""

        def collect(self):
            for method in methods:
                node = StartMethodNotebook.from_parent(self, path=self.path, name=f"{self.path.name}[{method}]",
                                                       nodeid=f"{_rel(self.config, self.path)}[{method}]")
                node.lab_start_method = method
                yield node

    return StartMethodPass.from_parent(parent, path=file_path, name=f"{file_path.name}-start-methods",
                                       nodeid=f"{_rel(parent.config, file_path)}-start-methods")


def _rel(config, path) -> str:
    try:
        return path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return path.as_posix()


def pytest_generate_tests(metafunc) -> None:
    if "lab_start_method" in metafunc.fixturenames:
        config = metafunc.config
        values = [None, *getattr(config, "_lab_also", [])]
        metafunc.parametrize("lab_start_method", values,
                             ids=["default" if v is None else v for v in values])


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (pyproject's default): the lab's scheduler, which keeps a notebook on one process
    and hands out the longest group first (see ``labutils.testing.xdist_schedule``)."""
    if getattr(config.option, "dist", None) != "loadfile":
        return None
    from .xdist_schedule import LongestFirstScheduling

    return LongestFirstScheduling(config, log)


@pytest.fixture
def lab_repeat(request) -> int:
    """How many times a timing-sensitive demonstration is repeated (``--lab-repeat``, at least 1)."""
    n = request.config.getoption("--lab-repeat")
    if n < 1:
        raise pytest.UsageError(f"--lab-repeat {n}: give 1 or more")
    return n

