"""Stability benchmark: run every notebook and solution N times and count, per cell, how often it failed.

    python tests/tools/soak_notebooks.py --runs 5                          # every notebook and solution, fork
    python tests/tools/soak_notebooks.py --runs 5 --start-method forkserver
    python tests/tools/soak_notebooks.py --runs 2 notebooks/04_memory_and_oom.ipynb notebooks/07_*.ipynb
    python tests/tools/soak_notebooks.py --runs 5 --jobs 2                 # two notebooks at once (2 cores)

Each run executes a notebook top to bottom in a fresh Jupyter kernel (nbclient), with the notebook's
folder as the working directory and ``LABUTILS_START_METHOD`` set for the kernel and every isolated run,
as ``pytest --nbval-lax`` does. ``--jobs N`` (1 by default) runs up to N notebooks at once, each in a
process of its own, as ``pytest -n N`` does, and never two runs of the same notebook at once (a notebook
writes files in its folder). Cells marked ``# NBVAL_SKIP``
are not run; a cell marked ``# NBVAL_RAISES_EXCEPTION`` fails when it does *not* raise. A cell that raises is counted
and the notebook goes on (as nbval does); a dead kernel or a cell over the timeout ends that run of that
notebook and is counted against the cell that was running (a kernel that never started: cell -1).
The report: per failing cell, how many runs it failed in and the first line of each distinct
failure; then a total. Exit status 1 when any cell failed, 2 for bad options.

Stopped by Ctrl-C, SIGTERM or SIGHUP, it stops every notebook's kernel as nbclient does (a shutdown
request, a kill only if the kernel does not go), prints the table of the runs that ended, removes what
the kernels' isolated runs left (``clean_after_dead_runners``: only run folders whose runner is dead, by
identity) and exits with status 130.

Every notebook run has a temporary folder of its own (``TMPDIR`` for its kernel and every run below it), in
one folder of the soak's: a run that ended without a failing cell but left something there fails "after
the last cell", naming what it left. Each folder goes when its run ends, and the soak's when the soak does
(stopped or not), so a stopped soak leaves no notebook's work folder in /tmp.

Run it through the machine's CPU lock where others share the machine (``/work/tools/cpuslot``), and say
"loaded machine" beside any figure taken that way.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("fork", "forkserver", "spawn")
SKIP, RAISES = "# NBVAL_SKIP", "# NBVAL_RAISES_EXCEPTION"
LEFT_CELL = 10_000  # where a run that left files in its temporary folder is counted: after the last cell


def default_notebooks() -> list:
    folder = ROOT / "notebooks"
    return sorted(folder.glob("[0-9][0-9]*_*.ipynb")) + sorted((folder / "solutions").glob("*.ipynb"))


def _marked(source: str, marker: str) -> bool:
    return any(line.strip() == marker for line in source.splitlines())


KEEP_ENV = "LAB_SOAK_KEEP_FAILED"  #: where --keep-failed writes failing runs (read by the pool's processes)


def _first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def _error_of(cell) -> str:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return _first_line(f"{out.get('ename', 'Error')}: {out.get('evalue', '')}")
    return ""


def run_once(path: Path, start_method: str, timeout: int, tmp_root: str | None = None) -> dict:
    """Execute ``path`` once; ``{cell index: first line of its failure}`` (nbval's cell numbering).

    With ``tmp_root``, the kernel (and every run below it) gets a temporary folder of its own there
    (``TMPDIR``); what a run that ended normally leaves in it is a failure of the notebook's last cell, and
    the folder is removed either way."""
    if tmp_root is None:
        return _run_once(path, start_method, timeout)
    tmp = tempfile.mkdtemp(prefix=path.stem[:24] + "-", dir=tmp_root)
    os.environ["TMPDIR"] = tmp
    tempfile.tempdir = None  # this process reads TMPDIR again (jupyter_client writes the kernel's files there)
    try:
        failures = _run_once(path, start_method, timeout)
        left = _left_in(tmp)
        if left and not failures:
            failures[LEFT_CELL] = f"left in its temporary folder: {', '.join(left[:5])}"
        return failures
    finally:
        os.environ.pop("TMPDIR", None)
        tempfile.tempdir = None
        shutil.rmtree(tmp, ignore_errors=True)


def _left_in(folder: str, grace: float = 5.0) -> list:
    """What is still in ``folder`` after up to ``grace`` seconds (the stopped kernel's runs clean up as they
    exit)."""
    deadline = time.monotonic() + grace
    while True:
        left = sorted(os.listdir(folder))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _run_once(path: Path, start_method: str, timeout: int) -> dict:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(str(path), as_version=4)
    raises = set()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if _marked(cell.source, SKIP):
            cell.source = ""  # not run, as nbval skips it; the numbering stays
        elif _marked(cell.source, RAISES):
            raises.add(i)
    os.environ["LABUTILS_START_METHOD"] = start_method  # the kernel and every run below it inherit it
    started = [-1]  # the cell being executed: the one a timeout or a dead kernel is counted against

    def on_cell_execute(cell, cell_index, **_):
        started[0] = cell_index

    client = NotebookClient(nb, timeout=timeout, allow_errors=True, interrupt_on_timeout=False,
                            kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                            on_cell_execute=on_cell_execute)
    failures, ended = {}, None
    try:
        client.execute()
    except (CellTimeoutError, DeadKernelError, CellExecutionError) as exc:
        ended = f"{type(exc).__name__}: {_first_line(exc)}"
    except Exception as exc:  # noqa: BLE001 - a kernel that would not start, a lost connection: this run ends
        ended = f"{type(exc).__name__}: {_first_line(exc)}"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source:
            continue
        error = _error_of(cell)
        if i in raises:
            if not error and cell.get("execution_count") is not None:
                failures[i] = "expected an exception (NBVAL_RAISES_EXCEPTION); the cell raised none"
        elif error:
            failures[i] = error
    if ended:  # the cause, rather than what it left in the cell (a timeout's interrupt: KeyboardInterrupt)
        failures[started[0]] = ended
    keep = os.environ.get(KEEP_ENV)
    if failures and keep:  # --keep-failed: the executed notebook, with every output, to read the failure in
        fd, kept = tempfile.mkstemp(prefix=path.stem + "-", suffix=".ipynb", dir=keep)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            nbformat.write(nb, fh)
    return failures


def _timed_run(path: Path, start_method: str, timeout: int, tmp_root: str | None = None) -> tuple:
    t0 = time.monotonic()
    failures = run_once(path, start_method, timeout, tmp_root)
    return failures, time.monotonic() - t0


def _runs(paths: list, runs: int, start_method: str, timeout: int, jobs: int, tmp_root: str | None = None):
    """Yield ``(run, path, failures, seconds)`` for every run of every notebook, as each one ends: up to
    ``jobs`` at once, each in a process of its own (spawned: a fresh interpreter, as a pytest-xdist worker,
    so this process holds no kernel and can always stop them), never two runs of one notebook together."""
    todo = [(run, path) for run in range(1, runs + 1) for path in paths]
    context = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context,
                                                  initializer=_end_with, initargs=(os.getpid(),))
    try:
        running: dict = {}
        while todo or running:
            busy = {path for _run, path in running.values()}
            for task in [t for t in todo if t[1] not in busy][: jobs - len(running)]:
                todo.remove(task)
                busy.add(task[1])
                running[pool.submit(_timed_run, task[1], start_method, timeout, tmp_root)] = task
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                run, path = running.pop(future)
                try:
                    failures, seconds = future.result()
                except Exception as exc:  # noqa: BLE001 - the process running it died: that run failed
                    failures, seconds = {-1: f"{type(exc).__name__}: {_first_line(exc)}"}, float("nan")
                yield run, path, failures, seconds
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown(wait=True)


def _stop(pool, grace: float = 30.0) -> None:
    """End the pool's processes: SIGTERM first (nbclient, in each, then shuts its kernel down), SIGKILL
    for any still there after ``grace`` seconds."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def _end_with(parent: int) -> None:
    """In a pool process: get SIGTERM when this soak ends, however it ends (Linux ``PR_SET_PDEATHSIG``),
    so that even a SIGKILLed soak leaves no notebook running: nbclient then stops the kernel."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the soak ended before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _clean_after_kernels() -> dict:
    """What the stopped kernels' isolated runs left: run folders whose runner is dead (by identity)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from labutils.runner.ownership import clean_after_dead_runners

    return clean_after_dead_runners(force=True)


def soak(paths: list, runs: int, start_method: str, timeout: int, out=sys.stdout, jobs: int = 1) -> int:
    """Run each notebook ``runs`` times; print the table; the number of cells that failed at least once."""
    counts = collections.Counter()
    firsts = collections.defaultdict(list)
    seconds = collections.defaultdict(list)
    t0, bad_runs, ended, stopped = time.monotonic(), 0, 0, None
    tmp_root = tempfile.mkdtemp(prefix="labsoak-")  # a folder per notebook run in it; all gone at the end
    try:
        for run, path, failures, took in _runs(paths, runs, start_method, timeout, jobs, tmp_root):
            seconds[path].append(took)
            bad_runs += bool(failures)
            ended += 1
            for cell, line in failures.items():
                counts[(path, cell)] += 1
                if line not in firsts[(path, cell)]:
                    firsts[(path, cell)].append(line)
            mark = f"{len(failures)} failing cell(s)" if failures else "ok"
            print(f"run {run}/{runs} {_name(path)}: {mark} ({took:.0f} s)", file=out, flush=True)
            for cell, line in sorted(failures.items()):  # as it happens: a long soak can be read while it goes
                print(f"    -> {_cell_name(cell)}: {line}", file=out, flush=True)
    except KeyboardInterrupt as exc:
        stopped = str(exc) or "SIGINT"
        removed = _clean_after_kernels()
        left = ", ".join(f"{len(v)} {k.replace('_', ' ')}" for k, v in removed.items() if v) or "nothing"
        print(f"\nsoak: stopped by {stopped}; every kernel stopped; the dead runs' leftovers removed: {left}",
              file=out, flush=True)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    wall = time.monotonic() - t0
    what = f"{ended} of {runs * len(paths)} notebook run(s) ended before the stop" if stopped else f"{runs} run(s)"
    print(f"\nsoak: {what} of {len(paths)} notebook(s) under {start_method}, {jobs} at a time, "
          f"{wall:.0f} s in all", file=out)
    for path in paths:
        bad = sorted(c for p, c in counts if p == path)
        times = [t for t in seconds[path] if t == t] or [float("nan")]  # NaN: the run's process died
        print(f"  {_name(path)}: {len(bad)} failing cell(s); {min(times):.0f}-{max(times):.0f} s a run", file=out)
        for cell in bad:
            print(f"    {_cell_name(cell)}: failed {counts[(path, cell)]}/{runs}", file=out)
            for line in firsts[(path, cell)]:
                print(f"      {line}", file=out)
    total = len(counts)
    print(f"total: {total} failing cell(s), {sum(counts.values())} failure(s) in {ended} "
          f"notebook run(s), {bad_runs} of them with a failing cell", file=out)
    if stopped:
        raise KeyboardInterrupt(stopped)
    return total


def _cell_name(cell: int) -> str:
    return "after the last cell" if cell == LEFT_CELL else f"cell {cell}"


def _name(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/tools/soak_notebooks.py",
                                     description="Run notebooks N times and count failing cells.")
    parser.add_argument("--runs", type=int, default=5, help="runs of each notebook (default 5)")
    parser.add_argument("--start-method", default="fork", help=f"one of {', '.join(METHODS)} (default fork)")
    parser.add_argument("--timeout", type=int, default=240, help="seconds a cell may take (default 240)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="notebooks run at once, each in a process of its own (default 1; 2 on 2 cores)")
    parser.add_argument("--keep-failed", metavar="DIR",
                        help="write each run with a failing cell, executed with its outputs, to this folder")
    parser.add_argument("notebooks", nargs="*", help="notebooks to run (default: every notebook and solution)")
    args = parser.parse_args(argv)
    problems = []
    if args.keep_failed and not os.path.isdir(args.keep_failed):
        problems.append(f"--keep-failed {args.keep_failed}: no such folder; make it first")
    if args.runs < 1:
        problems.append(f"--runs {args.runs}: give 1 or more")
    if args.start_method not in METHODS:
        problems.append(f"--start-method {args.start_method!r}: use one of {', '.join(METHODS)}")
    if args.timeout < 1:
        problems.append(f"--timeout {args.timeout}: give 1 or more seconds")
    if args.jobs < 1:
        problems.append(f"--jobs {args.jobs}: give 1 or more")
    paths = list(dict.fromkeys(Path(p) for p in args.notebooks)) or default_notebooks()
    problems += [f"{p}: no such notebook" for p in paths if p.suffix != ".ipynb" or not p.is_file()]
    if problems:
        for line in problems:
            print(f"soak_notebooks: {line}", file=sys.stderr)
        return 2
    if args.keep_failed:
        os.environ[KEEP_ENV] = os.path.abspath(args.keep_failed)  # the pool's processes inherit it
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    try:
        return 1 if soak(paths, args.runs, args.start_method, args.timeout, jobs=args.jobs) else 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
