"""`python -m labutils`: one argparse front door; every command keeps its options and exit codes."""

import subprocess
import sys

import pytest

from labutils.commands.main import COMMANDS, main

PY = sys.executable


def labutils(*args, timeout=120):
    return subprocess.run([PY, "-m", "labutils", *args], capture_output=True, text=True, timeout=timeout)


def test_no_command_prints_the_commands_and_exits_2():
    done = labutils()
    assert done.returncode == 2 and all(name in done.stderr for name in COMMANDS)


def test_help_lists_every_command():
    done = labutils("--help")
    assert done.returncode == 0 and all(name in done.stdout for name in COMMANDS)


def test_unknown_command_is_one_line_and_exit_2():
    done = labutils("diagnoze", "x.py")
    assert done.returncode == 2 and "unknown command 'diagnoze'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command, text", [("doctor", "--num-workers"), ("diagnose", "--stall"),
                                           ("tour", "--only"), ("run", "scenario")])
def test_each_command_answers_help_with_its_own_options(command, text):
    done = labutils(command, "--help")
    assert done.returncode == 0 and text in done.stdout, done.stdout + done.stderr


def test_the_rest_of_the_line_reaches_the_command_untouched(capsys, monkeypatch):
    from labutils.commands import main as front

    seen = []
    with monkeypatch.context() as patch:
        patch.setattr(front, "_dispatch", lambda command, rest: seen.append((command, rest)) or 0)
        assert main(["diagnose", "--json", "s.py", "--json", "-x"]) == 0
    assert seen == [("diagnose", ["--json", "s.py", "--json", "-x"])]
    assert main(["doctor", "--prefetch-factor", "0"]) == 2
    assert "must be at least 1" in capsys.readouterr().err


def test_diagnose_stall_option_is_checked():
    done = labutils("diagnose", "--stall", "soon", "x.py")
    assert done.returncode == 2 and "--stall" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("raw, printed", [
    (b'\xef\xbb\xbfprint("bom ok")\n', "bom ok"),  # a UTF-8 BOM, as Windows editors write
    (b'# -*- coding: latin-1 -*-\nprint("caf\xe9")\n', "caf\u00e9"),  # a coding cookie, not UTF-8 bytes
])
def test_scripts_are_read_the_way_python_reads_them(tmp_path, raw, printed):
    script = tmp_path / "encoded.py"
    script.write_bytes(raw)
    done = labutils("diagnose", str(script))
    assert done.returncode == 0, done.stderr
    assert printed in done.stdout or printed in done.stderr


def test_a_bad_limit_names_the_flag_as_typed(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("print('hi')\n")
    done = labutils("diagnose", "--shm-size", "0", str(script))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("labutils diagnose: --shm-size 0:"), done.stderr
