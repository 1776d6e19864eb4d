"""pytest plugin of the lab (loaded by ``-p labsuite.pytest_plugin`` in pyproject.toml).

* ``--lab-start-method M`` runs the whole suite (the notebooks' kernels and every isolated run) under the
  default start method ``M`` (``fork``, ``forkserver`` or ``spawn``), through ``LABUTILS_START_METHOD``:
  this is how the lab is tested as Python 3.14 (forkserver) and macOS (spawn) see it.
* plain ``pytest`` runs every test and every notebook and solution once, under this machine's default;
* ``--lab-matrix`` adds a pass under ``forkserver`` (Python 3.14's Linux default, its fork server emulated
  through the switch) and one under ``spawn`` (macOS): every notebook and solution again, and every test
  that takes the ``lab_start_method`` fixture one more parameter per method (a method equal to the
  main one is not run twice). ``.ci/run`` runs the matrix.
* ``--lab-also-start-method M`` (repeatable, comma-separated; the ``lab_also_start_methods`` ini value
  sets the default, none in this repository) adds the pass of one method; ``none`` adds nothing.
* At the end of the session, every file that the session's own processes made in /dev/shm or /tmp and
  left there fails the session, named with the process and the test that made it
  (:mod:`labsuite.leaks`; ``--lab-no-leak-check`` turns it off).
"""

from __future__ import annotations

import os

import pytest

from labutils.runner import startmethod

from . import leaks

#: the extra passes of ``--lab-matrix``: Python 3.14's Linux default, and macOS's
MATRIX = ("forkserver", "spawn")


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
    group.addoption("--lab-matrix", action="store_true", default=False,
                    help="also run every notebook, solution and start-method test under " + ", ".join(MATRIX)
                         + " (what .ci/run runs)")
    group.addoption("--lab-no-leak-check", action="store_true", default=False,
                    help="do not fail the session for /dev/shm and /tmp files its processes left")
    parser.addini("lab_also_start_methods", "start methods for the extra notebook pass", type="args",
                  default=[])


def _main_method(config) -> str:
    return config.getoption("--lab-start-method") or startmethod.requested() or startmethod.python_default()


def _also_methods(config) -> list:
    given = config.getoption("--lab-also-start-method")
    values = list(given if given is not None else config.getini("lab_also_start_methods"))
    if config.getoption("--lab-matrix"):
        values = [*MATRIX, *values]
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


_SESSION_ENV = (startmethod.ENV, leaks.LEDGER_ENV, leaks.RUNNER_LEDGER_ENV, "PYTHONPATH")


def pytest_configure(config) -> None:
    # what unconfigure puts back (a pytest run in-process by pytester must not change its caller's defaults)
    config._lab_restore = ({k: os.environ.get(k) for k in _SESSION_ENV}, startmethod.current())
    method = config.getoption("--lab-start-method")
    if method:
        os.environ[startmethod.ENV] = method  # inherited by every kernel and isolated run
    startmethod.apply_requested()
    config._lab_also = _also_methods(config)
    _stop_kernels_as_jupyter_does()
    _read_iopub_while_cells_run()
    config._lab_leaks = None
    nested = leaks.LEDGER_ENV in os.environ  # a pytest inside the suite: the outer session checks its files
    if not hasattr(config, "workerinput") and not nested and not config.getoption("--lab-no-leak-check"):
        config._lab_leaks = leaks.Session.start()
        config._lab_leaks.environ(os.environ)  # inherited by xdist workers, kernels and runs
        leaks.watch_this_process()


def _stop_kernels_as_jupyter_does() -> None:
    """nbval stops each notebook's kernel with ``shutdown_kernel(now=True)``: a SIGKILL to the kernel's
    process group, the kernel's resource tracker included, so nothing the kernel still holds is cleaned
    up. A notebook that keeps a spawn or forkserver DataLoader iterator alive (an exception's traceback is
    enough) then leaves its named semaphores in /dev/shm: 11 for one worker (notebook 08 did, once per
    pass). Jupyter's own "Shut down" and "Restart" ask the kernel first and kill it only if it does not
    exit; the suite's kernels now stop that way, so their atexit handlers (multiprocessing's finalizers)
    run as they would for a learner."""
    try:
        from nbval import kernel
    except ImportError:
        return
    if getattr(kernel.RunningKernel.stop, "_labutils_graceful", False):
        return

    def stop(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)  # a shutdown request; SIGKILL only after shutdown_wait_time
        del self.km

    stop._labutils_graceful = True
    kernel.RunningKernel.stop = stop


def _read_iopub_while_cells_run() -> None:
    """nbval reads a cell's messages (its output, and the "idle" status that ends it) only after the cell
    has replied. Until then they wait in ZeroMQ's queues, which hold about a thousand messages on each side
    and then drop the newest: the "idle" status among them. nbval then fails a cell that passed, with
    "Timeout of N seconds exceeded waiting for output". The lab's live chart sends a hundred widget
    messages a second while a run goes, so a cell of several runs gets there on a slow machine: CI's
    spawn pass failed 09's solutions that way (the fd_limit search, 5 runs, 1,900 messages in 15 s here).
    Jupyter's front ends read these messages as they come; the suite's kernels now do too: while a cell
    runs, its messages are read into a buffer that nbval's later reads take first, in order."""
    try:
        import zmq
        from nbval import kernel
    except ImportError:
        return
    if getattr(kernel.RunningKernel.await_reply, "_labutils_reads_iopub", False):
        return
    import collections
    import time
    from queue import Empty

    get_message = kernel.RunningKernel.get_message

    def buffered(self, stream, timeout=None):
        pending = self.__dict__.get("_labutils_iopub")
        if stream == "iopub" and pending:
            return pending.popleft()
        return get_message(self, stream, timeout=timeout)

    def await_reply(self, msg_id, timeout=None):
        pending = self.__dict__.setdefault("_labutils_iopub", collections.deque())
        iopub, shell = self.kc.iopub_channel, self.kc.shell_channel
        poller = zmq.Poller()
        poller.register(iopub.socket, zmq.POLLIN)
        poller.register(shell.socket, zmq.POLLIN)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = dict(poller.poll(None if left is None else int(left * 1000)))
            while iopub.socket in ready and iopub.msg_ready():
                pending.append(iopub.get_msg(timeout=0))
            if shell.socket in ready:
                msg = self.kc.get_shell_msg(timeout=0)
                if msg["parent_header"].get("msg_id") == msg_id:
                    if msg["content"]["status"] == "aborted":
                        raise RuntimeError("Kernel aborted execution request")  # as nbval's own
                    return
            if left is not None and left <= 0:  # as nbval's own: the cell's limit, however chatty the cell
                raise Empty

    buffered._labutils_reads_iopub = await_reply._labutils_reads_iopub = True
    kernel.RunningKernel.get_message = buffered
    kernel.RunningKernel.await_reply = await_reply


# nbval waits 5 s for each message a cell sends after its reply (a hard-coded ``output_timeout``). On a
# busy machine a cell that drives widgets can go quiet that long after its reply: CI saw notebook 09's first
# cell fail with "Timeout of 5 seconds exceeded waiting for output" on a 2-core machine running the matrix
# at 2.3 times its usual time. The cell's own limit (--nbval-cell-timeout) is what should stop a stuck cell.
NBVAL_OUTPUT_TIMEOUT = 60


def pytest_collection_modifyitems(session, config, items) -> None:
    for item in items:
        if hasattr(item, "output_timeout"):
            item.output_timeout = max(item.output_timeout, NBVAL_OUTPUT_TIMEOUT)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    check = getattr(session.config, "_lab_leaks", None)
    if check is None:
        return
    left = check.leftovers()
    session.config._lab_left = left
    # A file the session's own processes left in /dev/shm (shared memory every user of the machine pays for)
    # or in the shared /tmp fails the session: the runs and the session's processes have temporary folders
    # of their own, removed with them, so whatever is left outside them was lost by our code.
    if leaks.failing(left) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _in_shm(item) -> bool:
    return os.path.dirname(item.path) == leaks.SHM


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    left = getattr(config, "_lab_left", None)
    if not left:
        return
    shm = [item for item in left if _in_shm(item)]
    terminalreporter.section("files this session left in /dev/shm and /tmp", red=True)
    for item in left:
        terminalreporter.line(item.line())
    terminalreporter.line(f"labutils: {len(shm)} file(s) in /dev/shm and {len(left) - len(shm)} in /tmp made by this "
                          "session's processes are still there; the session fails (--lab-no-leak-check to skip "
                          "this check)", red=True)


def pytest_unconfigure(config) -> None:
    if hasattr(config, "workerinput"):
        _remove_own_mp_tempdir()
    check = getattr(config, "_lab_leaks", None)
    if check is not None:
        check.close()
        config._lab_leaks = None
    saved, method = getattr(config, "_lab_restore", ({}, None))
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if method is not None and startmethod.current() != method:
        startmethod.set_default(method)


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
    and hands out the longest group first (see ``labsuite.xdist_schedule``)."""
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


def _remove_own_mp_tempdir() -> None:
    """An xdist worker ends without running multiprocessing's exit handler, so the ``pymp-*`` folder of a test
    that used multiprocessing in the worker itself would stay: remove this process's own folder."""
    import shutil
    from multiprocessing import process

    path = process.current_process()._config.get("tempdir")
    if path and os.path.basename(path).startswith("pymp-"):
        shutil.rmtree(path, ignore_errors=True)
