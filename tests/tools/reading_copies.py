"""Reading copies: ``python tests/tools/reading_copies.py [NOTEBOOK ...]``.

Executes each lesson notebook and solution (default: all of them) top to bottom in a real Jupyter kernel
under one start method (``--start-method``, default fork) and writes the executed copy, outputs and plots
included, to ``notebooks/reading/`` (solutions to ``notebooks/reading/solutions/``), where GitHub renders it.
The lessons themselves stay stripped. The pids, times and paths in a copy are what that run printed; the
copy's metadata says when, where and under which start method it ran. ``tests/test_reading.py`` fails when a
copy's cells no longer match its notebook's: run this command again after editing a notebook.

A notebook whose run stops on an error is reported and its copy is not written (an old copy stays, and the
staleness test names it). Exit status 1 if any notebook failed.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
READING = os.path.join(NOTEBOOKS, "reading")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reading import lessons  # noqa: E402  (tests/tools/reading.py: the same list of lessons)


def copy_path(path: str) -> str:
    """``notebooks/NN_x.ipynb -> notebooks/reading/NN_x.ipynb``; solutions under ``reading/solutions/``."""
    rel = os.path.relpath(os.path.abspath(path), NOTEBOOKS)
    return os.path.join(READING, rel)


def _versions() -> dict:
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:  # the kernel needs it anyway; the record just says so
        torch_version = None
    return {"python": platform.python_version(), "torch": torch_version, "platform": platform.platform()}


def execute(path: str, start_method: str, timeout: int):
    """Run one notebook in a fresh kernel from its own folder; return the executed notebook."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    env_before = {k: os.environ.get(k) for k in ("LABUTILS_START_METHOD", "PYTHONPATH")}
    os.environ["LABUTILS_START_METHOD"] = start_method
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env_before["PYTHONPATH"]) if p)
    try:
        client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                                         resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}})
        client.execute()
    finally:
        for key, value in env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return nb


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/tools/reading_copies.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="notebooks to execute (default: every lesson and solution)")
    parser.add_argument("--start-method", default="fork", choices=["fork", "forkserver", "spawn"])
    parser.add_argument("--timeout", type=int, default=300, help="seconds a cell may run (default 300)")
    args = parser.parse_args(argv)
    paths = [os.path.abspath(p) for p in args.notebooks] or lessons()
    for path in paths:
        if not os.path.isfile(path) or not path.startswith(NOTEBOOKS + os.sep) or path.startswith(READING):
            parser.error(f"{path}: not a lesson notebook under notebooks/ (give notebooks/NN_name.ipynb)")
    import nbformat

    failed, started = [], time.monotonic()
    for path in paths:
        t0 = time.monotonic()
        rel = os.path.relpath(path, ROOT)
        try:
            nb = execute(path, args.start_method, args.timeout)
        except Exception as exc:  # noqa: BLE001 - report every notebook, then exit 1
            failed.append(rel)
            print(f"{rel}: FAILED ({type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]})", flush=True)
            continue
        nb.metadata["reading_copy"] = {
            "source": rel, "start_method": args.start_method,
            "executed": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "seconds": round(time.monotonic() - t0, 1), **_versions()}
        out = copy_path(path)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        nbformat.write(nb, out)
        print(f"{rel}: {time.monotonic() - t0:.0f} s -> {os.path.relpath(out, ROOT)}", flush=True)
    print(f"{len(paths) - len(failed)} of {len(paths)} written in {time.monotonic() - started:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
