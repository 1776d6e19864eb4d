"""notebooks/CHEATSHEET.md is the output of `python -m labutils cheatsheet`, and names every cause;
notebooks/HANDOUT.md is the output of `python -m labutils cheatsheet --handout`, the one-page version.
Both give a message's own variant's first fix, and every first fix is said with PyTorch and Python alone."""

import json
import os
import re
import subprocess
import sys

from labutils.commands.cheatsheet import COMMAND, HANDOUT_COMMAND, cheatsheet_markdown, handout_markdown, handout_rows
from labutils.diagnosis.causes import CATALOGUE, CAUSES, ECHOES, LOADER_CAUSES, cheatsheet_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHEET = os.path.join(ROOT, "notebooks", "CHEATSHEET.md")
HANDOUT = os.path.join(ROOT, "notebooks", "HANDOUT.md")


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
    with open(os.path.join(ROOT, "labutils", "README.md"), encoding="utf-8") as fh:  # moved from README.md
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
        places = {"notebooks/CHEATSHEET.md": _flat(fh.read()),
                  "labutils/README.md's error-text map": _flat(_readme_map())}
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


# --------------------------------------------------------------------------- variants, echoes, the handout
def test_the_handout_is_current_and_printed_by_the_command():
    with open(HANDOUT, encoding="utf-8") as fh:
        assert fh.read() == handout_markdown(), f"notebooks/HANDOUT.md is out of date: run `{HANDOUT_COMMAND}`"
    done = subprocess.run([sys.executable, "-m", "labutils", "cheatsheet", "--handout"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0 and done.stdout == handout_markdown(), done.stderr


def test_every_variant_message_gets_its_variants_first_fix():
    by_message = {msg: fix for msg, _cause, fix, _path in cheatsheet_rows()}
    checked = 0
    for cause in CATALOGUE.values():
        for msg, variant in cause.message_rows():
            assert variant is None or variant in cause.variants, (cause.id, variant)
            if variant and "fixes" in cause.variants[variant]:
                own = cause.fix_list(variant)[0].text
                assert by_message[msg] == own != cause.fix_list()[0].text, (cause.id, msg)
                checked += 1
    assert checked >= 4, checked  # RemoveIPC's two, the user's fd leak, a main-process segfault
    removed = [fix for msg, fix in by_message.items() if "deleted under the loader" in msg]
    assert len(removed) == 2, removed
    for fix in removed:  # the RemoveIPC variant's ways out, not "give /dev/shm more room"
        assert "loginctl enable-linger" in fix and "RemoveIPC=no" in fix and "file_descriptor" in fix, fix
        assert "--shm-size" not in fix, fix


def test_every_variant_with_its_own_fixes_has_its_own_short_fix_on_the_handout():
    shorts = {(cause, short) for _family, _text, cause, short in handout_rows()}
    for cause in CATALOGUE.values():
        for name, variant in cause.variants.items():
            if "fixes" in variant:
                assert variant.get("short") and variant["short"] != cause.short, (cause.id, name)
    assert ("shm_exhausted", CATALOGUE["shm_exhausted"].short_for("removed")) in shorts
    assert ("fd_limit", CATALOGUE["fd_limit"].short_for("user_leak")) in shorts
    assert "enable-linger" in CATALOGUE["shm_exhausted"].short_for("removed")


def test_the_echo_rows_send_the_reader_to_the_workers_exit_status():
    rows = [r for r in cheatsheet_rows() if "rebuild_storage_fd" in r[0]]
    assert len(rows) == 2 == len(ECHOES), rows
    for msg, said, fix, _path in rows:
        assert said != "worker_exit" and "read the worker's exit status" in said, (msg, said)
        assert "SIGKILL" in fix and "04_memory_and_oom" in fix and "01_read_the_error" in fix, fix
        assert "sys.exit" not in fix, fix
    echo = [r for r in handout_rows() if r[2] == "echo"]
    assert len(echo) == 2 and all("see 04" in r[3] and "see 01" in r[3] for r in echo), echo


def _before_the_labs_helper(fix: str) -> str:
    return fix.split("the lab's", 1)[0]


def test_each_first_fix_is_said_with_pytorch_and_python_before_the_labs_helper():
    for msg, _cause, fix, _path in cheatsheet_rows():
        plain = _before_the_labs_helper(fix)
        assert "labutils" not in plain and len(plain.split()) >= 4, (msg, fix)
    for cause in CATALOGUE.values():  # the diagnosis's own first fix too, of every variant
        for variant in [None, *cause.variants]:
            fixes = cause.fix_list(variant)
            if fixes:
                assert "labutils" not in _before_the_labs_helper(fixes[0].text), (cause.id, variant)
    for _family, _text, _cause, short in handout_rows():
        assert "labutils" not in short, short


def test_the_handout_fits_a_page_and_quotes_the_catalogue():
    rows = handout_rows()
    causes = {cause for _f, _t, cause, _s in rows}
    assert set(LOADER_CAUSES) | {"outside_loader", "echo"} == causes, causes
    messages = {c.id: [_flat(m) for m, _v in c.message_rows()] for c in CATALOGUE.values()}
    messages["echo"] = [_flat(e[0]) for e in ECHOES]
    for _family, text, cause, short in rows:
        assert len(short.split()) < 15, short
        parts = _stable_parts(text)
        assert parts and any(all(p in m for p in parts) for m in messages[cause]), (cause, text)
    text = handout_markdown()
    # what a reader sees of each table line: its text without the Markdown marks
    table = [" ".join(re.sub(r"[`|*]", " ", line).split()) for line in text.splitlines() if line.startswith("| ")]
    # one printed page (A4 or Letter) holds about 40 table lines of this width at a normal font: these bounds
    # are what a test can check; the page itself was not printed here
    assert len(table) <= 32 and max(len(line) for line in table) <= 200, (len(table), max(map(len, table)))
    assert len(text.split()) <= 700, len(text.split())
