"""`python -m labutils diagnose NOTEBOOK.ipynb`: the notebook runs in a real Jupyter kernel, isolated.

The kernel's __main__ has no file, exactly as in JupyterLab: a Dataset defined in a cell cannot be
imported by spawn workers. The report names the cause and the failing cell, and no kernel process
outlives the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import nbformat
import pytest

import labutils

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DATASET = ("import torch\nfrom torch.utils.data import DataLoader, Dataset\n\n"
           "class Squares(Dataset):\n    def __len__(self):\n        return 8\n\n"
           "    def __getitem__(self, i):\n        return torch.tensor(i * i)\n")


def notebook(path, method, workers=2):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# squares"),
        nbformat.v4.new_code_cell(DATASET),
        nbformat.v4.new_code_cell(f"loader = DataLoader(Squares(), batch_size=2, num_workers={workers}, "
                                  f"multiprocessing_context={method!r})\nprint([b.tolist() for b in loader])"),
        nbformat.v4.new_code_cell("print('after the loader')"),
    ]
    nbformat.write(nb, str(path))
    return path


def diagnose(*args, timeout=240):
    return subprocess.run([PY, "-m", "labutils", "diagnose", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _kernels_left() -> list:
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            env = p.environ()
        except (psutil.Error, OSError):
            continue
        run_dir = env.get("LABUTILS_RUN_DIR")
        if run_dir and not os.path.isdir(run_dir) and "ipykernel" in " ".join(p.info["cmdline"] or []):
            out.append(p.pid)
    return out


def test_dataset_defined_in_a_cell_with_spawn_is_main_not_importable(tmp_path, no_leaks):
    path = notebook(tmp_path / "trap.ipynb", "spawn", workers=1)  # one spawn worker is enough to fall in it
    done = diagnose("--json", str(path))
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)
    assert data["cause"] == "main_not_importable" and data["confidence"] == "high", data["evidence"]
    assert data["cell"]["index"] == 2 and "DataLoader(Squares()" in data["cell"]["head"]
    assert "Can't get attribute 'Squares'" in data["stderr"]
    assert any(w["exitcode"] == 1 for w in data["workers"])
    assert _kernels_left() == [] and labutils.find_strays() == []


def test_the_same_notebook_with_fork_is_ok_and_runs_every_cell(tmp_path, no_leaks):
    path = notebook(tmp_path / "fine.ipynb", "fork")
    done = diagnose(str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cause: ok" in done.stdout and "after the loader" in done.stdout
    assert _kernels_left() == []


@pytest.mark.parametrize("text, message", [("{not json", "not a Jupyter notebook"),
                                           ('{"cells": 3}', "no list of cells")])
def test_a_broken_notebook_file_is_a_one_line_usage_error(tmp_path, text, message):
    path = tmp_path / "bad.ipynb"
    path.write_text(text)
    done = diagnose(str(path), timeout=60)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_a_notebook_takes_no_script_arguments(tmp_path, capsys):
    from labutils.commands.diagnose import diagnose_main  # in this process: nbclient is imported once, not again

    path = notebook(tmp_path / "n.ipynb", "fork")
    assert diagnose_main([str(path), "--epochs", "3"]) == 2
    assert "takes no arguments" in capsys.readouterr().err


def test_a_stuck_cell_is_a_hang_stopped_by_progress_and_named(tmp_path, no_leaks):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(DATASET),
                nbformat.v4.new_code_cell("import time\n\nclass Stuck(Squares):\n    def __getitem__(self, i):\n"
                                          "        time.sleep(600)\n\n"
                                          "for b in DataLoader(Stuck(), batch_size=2, num_workers=2, "
                                          "multiprocessing_context='fork'):\n    pass")]
    path = tmp_path / "stuck.ipynb"
    nbformat.write(nb, str(path))
    done = diagnose("--json", "--stall", "2", str(path))  # idle from the loader's start: the kernel's is not counted
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)
    assert data["cause"] == "hang" and data["confidence"] == "high", data["evidence"]
    assert data["stall"]["limit"] == 2 and data["cell"]["index"] == 1
    assert _kernels_left() == [] and labutils.find_strays() == []
