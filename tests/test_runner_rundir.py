"""The run directory's names: one module (labutils/runner/rundir.py); the copies that cannot import it agree."""

import re
from pathlib import Path

from labutils.runner import rundir

RUNNER = Path(__file__).resolve().parents[1] / "labutils" / "runner"


def test_child_writes_the_names_rundir_declares():
    """child.py is copied into the run directory and loaded from there, so it repeats two names."""
    text = (RUNNER / "child.py").read_text()
    assert f'"{rundir.STACKS}"' in text and f'"{rundir.CREATED_SHM}"' in text
    assert f'"{rundir.CREATED_TMP}"' in text


def test_no_run_dir_file_name_is_spelled_out_in_the_runner():
    names = [v for k, v in vars(rundir).items() if k.isupper() and isinstance(v, str) and "." in v]
    for path in RUNNER.glob("*.py"):
        if path.name in ("rundir.py", "child.py"):
            continue
        text = path.read_text()
        for name in names:
            literal = re.search(rf'["\']{re.escape(name)}["\']', text)
            assert literal is None, f"{path.name} spells out {name!r}: use rundir"
