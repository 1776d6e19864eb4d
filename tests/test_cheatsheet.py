"""notebooks/CHEATSHEET.md is the output of `python -m labutils cheatsheet`, and names every cause."""

import json
import os
import re
import subprocess
import sys

from labutils.commands.cheatsheet import COMMAND, cheatsheet_markdown
from labutils.diagnosis.causes import CAUSES, cheatsheet_rows

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


#: The notebooks whose "Messages this notebook shows: `...`; `...`" paragraph the sheet and the README's map
#: must cover (review r2: the list is read from the notebooks, so a message a notebook adds is checked too).
TEACHING = ("10_production_loader", "10b_recommended_loader", "11_cuda_and_accelerators", "12_distributed_torchrun")
LEAD = "Messages this notebook shows:"
#: What varies in a quoted message: N, M, X and <Exc> stand for a number, a name or an exception class; the
#: word after "Caught" is an exception class (the README writes <Exc>); a number of 3+ digits is a pid.
PLACEHOLDER = re.compile(r"<Exc>|\b[NMX]\b|(?<=Caught )\w+|\b\d{3,}\b")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _taught(stem: str) -> list:
    """The backticked messages of the notebook's "Messages this notebook shows" paragraph."""
    with open(os.path.join(ROOT, "notebooks", f"{stem}.ipynb"), encoding="utf-8") as fh:
        cells = json.load(fh)["cells"]
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and LEAD in source:
            paragraph = source[source.index(LEAD):].split("\n\n", 1)[0]
            return [_flat(m) for m in re.findall(r"`([^`]+)`", paragraph)]
    raise AssertionError(f"notebooks/{stem}.ipynb has no paragraph starting {LEAD!r}")


def _stable_parts(message: str) -> list:
    """The message cut at its placeholders, each piece without the quotes and brackets around it."""
    return [p for p in (part.strip(" '\"()") for part in PLACEHOLDER.split(message)) if p]


def _readme_map() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    start = text.index("## Error text → where to look")
    return text[start:text.index("\n## ", start)]


def test_stable_parts_drop_what_varies():
    assert _stable_parts("DataLoader worker (pid N) is killed by signal: Terminated.") == [
        "DataLoader worker (pid", "is killed by signal: Terminated."]
    assert _stable_parts("Caught RuntimeError in pin memory thread for device 0") == [
        "Caught", "in pin memory thread for device 0"]
    assert _stable_parts("Can't get attribute 'X' on <module '__mp_main__'") == [
        "Can't get attribute", "on <module '__mp_main__"]
    assert _stable_parts("Signal 15 (SIGTERM) received by PID 4242") == ["Signal 15 (SIGTERM) received by PID"]


def test_the_messages_notebooks_10_to_12_teach_are_on_the_sheet():
    """Every message notebooks 10-12 list as shown, by its stable part, on the sheet and in the README's map."""
    with open(SHEET, encoding="utf-8") as fh:
        places = {"notebooks/CHEATSHEET.md": _flat(fh.read()), "README.md's error-text map": _flat(_readme_map())}
    missing = []
    for stem in TEACHING:
        messages = _taught(stem)
        assert len(messages) >= 3, (stem, messages)
        assert f"]({stem}.ipynb)" in places["notebooks/CHEATSHEET.md"], stem
        for message in messages:
            for part in _stable_parts(message):
                missing += [f"{stem}: {part!r} (of {message!r}) is not in {name}"
                            for name, text in places.items() if part not in text]
    assert not missing, "\n".join(missing)
