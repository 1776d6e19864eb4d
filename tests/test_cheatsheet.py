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
