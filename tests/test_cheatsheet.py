"""notebooks/CHEATSHEET.md is the output of `python -m labutils cheatsheet`, and names every cause."""

import os
import subprocess
import sys

from labutils.diagnosis.causes import CAUSES, cheatsheet_rows
from labutils.diagnosis.cheatsheet import COMMAND, cheatsheet_markdown

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHEET = os.path.join(ROOT, "notebooks", "CHEATSHEET.md")


def test_the_cheat_sheet_is_current():
    with open(SHEET, encoding="utf-8") as fh:
        on_disk = fh.read()
    assert on_disk == cheatsheet_markdown(), f"notebooks/CHEATSHEET.md is out of date: run `{COMMAND}`"


def test_every_cause_id_and_every_message_appears():
    text = cheatsheet_markdown()
    for cause in CAUSES:
        assert f"`{cause}`" in text, cause
    for msg, _cause, _fix, path in cheatsheet_rows():
        assert " ".join(msg.split()).replace("|", "\\|") in text, msg
        assert os.path.exists(os.path.join(ROOT, path)), path


def test_the_command_prints_the_sheet():
    done = subprocess.run(
        [sys.executable, "-m", "labutils", "cheatsheet"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == cheatsheet_markdown()


def test_the_messages_notebooks_10_to_12_teach_are_on_the_sheet():
    """The stable part of each message notebooks 10-12 teach, as the notebooks quote it (review r2)."""
    text = cheatsheet_markdown()
    for part in ("ChildFailedError", "Root Cause (first observed failure)", "closing signal SIGTERM",
                 "exitcode : -15", "Caught RuntimeError in pin memory thread for device 0",
                 "'pin_memory' argument is set as true but no accelerator is found",
                 "Can't get attribute 'LabeledDataset' on <module '__mp_main__'", "queue.Empty",
                 "killed by signal: Terminated", "Torch not compiled with CUDA enabled", "ConnectionResetError",
                 "Pin memory thread exited unexpectedly", "Gloo connectFullMesh failed"):
        assert part in text, part
    for stem in ("10_production_loader", "11_cuda_and_accelerators", "12_distributed_torchrun"):
        assert f"]({stem}.ipynb)" in text, stem
