"""Library scripts modelled on public reports (tests/corpus_libraries): each runs isolated through the
diagnose command's entry point in this process, and the cause is the one the run met; the healthy ones
(a handle opened in each worker, a spawn context, OpenCV after fork today) give `ok`.

Where the diagnosis is known to name another cause, the test expects that failure strictly, with the gap
in its reason (notes/H4-diagnosis-gaps.md): it flips when the diagnosis is fixed."""

from __future__ import annotations

import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "corpus_libraries")

#: script -> (expected cause, a text the run must show: what the library or PyTorch said, or "" for healthy)
CASES = {
    "lmdb_env_spawn.py": ("unpicklable_dataset", "cannot pickle 'Environment' object"),
    "lmdb_shared_env_fork.py": ("worker_exception", "MDB_READERS_FULL"),
    "lmdb_open_in_worker.py": ("ok", ""),
    "h5py_file_spawn.py": ("unpicklable_dataset", "h5py objects cannot be pickled"),
    "h5py_lazy_property.py": ("ok", ""),
    "h5py_metadata_then_close.py": ("ok", ""),
    "sqlite_connection_spawn.py": ("unpicklable_dataset", "cannot pickle 'sqlite3.Connection' object"),
    "polars_filter_fork.py": ("timeout", "DataLoader timed out after 5 seconds"),
    "polars_spawn_context.py": ("ok", ""),
    "numba_openmp_fork.py": ("native_crash", "fork() called from a process already using GNU OpenMP"),
    "opencv_after_fork.py": ("ok", ""),
    "imagefolder_appledouble.py": ("worker_exception", "cannot identify image file"),
    "mmap_rewritten_file.py": ("native_crash", "bus error"),
    "dataframe_object_column.py": ("ok", ""),
}
#: script -> the gap, where the diagnosis is known to name another cause (none open: the SIGTERM numba raises in
#: its own worker and the SIGBUS of a file cut short were gaps until the diagnosis learnt them)
GAPS: dict = {}


def _param(name):
    return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=GAPS[name])) if name in GAPS else name


def test_every_script_names_its_public_report():
    scripts = sorted(n for n in os.listdir(CORPUS) if n.endswith(".py"))
    assert scripts == sorted(CASES) and len(scripts) >= 12, scripts
    for name in scripts:
        with open(os.path.join(CORPUS, name), encoding="utf-8") as fh:
            first = fh.readline()
        assert re.match(r"# Modelled on https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+ ", first), (name, first)


@pytest.mark.parametrize("name", [_param(n) for n in CASES])
def test_library_script_is_diagnosed(name, capsys):
    from labutils.commands.diagnose import diagnose_main

    cause, shown = CASES[name]
    capsys.readouterr()
    rc = diagnose_main(["--json", "--launcher", "auto", "--timeout", "90", os.path.join(CORPUS, name)])
    out, err = capsys.readouterr()
    assert rc in (0, 1), err
    data = json.loads(out)
    why = f"{data['cause']} ({data['confidence']}): {data['summary']}\n" + "\n".join(data["evidence"]) \
        + "\n--- stderr\n" + data["stderr"][-2500:]
    if shown:  # the run really met the failure: the library's or PyTorch's own words
        assert shown.lower() in (data["stderr"] + json.dumps(data.get("exceptions", []))).lower(), why
    else:
        assert data["outcome"] == "ok", why
    assert data["cause"] == cause, why
    if cause == "ok":
        assert not data["fixes"], why
