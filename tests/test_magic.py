"""The %%isolate magic, driven through a real (headless) IPython shell."""

from __future__ import annotations

import pytest

IPython = pytest.importorskip("IPython")


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()  # the session's shell if another test made one already
    ip.run_line_magic("load_ext", "labutils")
    return ip


def test_isolate_stores_the_result(shell):
    shell.run_cell_magic("isolate", "-o res -q --timeout 60", "import labutils\nlabutils.emit(x=41 + 1)\n")
    res = shell.user_ns["res"]
    assert res.outcome == "ok" and res.values == {"x": 42}


def test_isolate_passes_limits(shell):
    shell.run_cell_magic("isolate", "-o lim -q --nofile 70 --env LAB_Y=7",
                         "import os, resource, labutils\n"
                         "labutils.emit(n=resource.getrlimit(resource.RLIMIT_NOFILE)[0], y=os.environ['LAB_Y'])\n")
    assert shell.user_ns["lim"].values == {"n": 70, "y": "7"}


def test_a_crash_in_the_cell_leaves_the_kernel_alive(shell):
    shell.run_cell_magic("isolate", "-o crash -q", "import ctypes\nctypes.string_at(0)\n")
    crash = shell.user_ns["crash"]
    assert crash.outcome == "failed" and crash.signal == 11
    shell.run_cell("after = 1 + 1")
    assert shell.user_ns["after"] == 2


@pytest.mark.parametrize("line, words", [
    ("--start-method thread", "--start-method thread: use one of fork"),
    ("--timeout soon", "invalid float"),
    ("--env NOEQUALS", "KEY=VALUE"),
    ("-o 1bad", "not a valid Python name"),
    ("--nofile many", "invalid int"),
    ("--memory-budget lots", "--memory-budget"),
    ("--timeout -3", "--timeout"),
    ("--env 'A=1", "close the quote"),
    ("--bogus 1", "unrecognized arguments"),
])
def test_bad_options_raise_a_usage_error(shell, line, words):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=words) as info:
        shell.run_cell_magic("isolate", line, "pass\n")
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message, message  # one line, no traceback


def test_isolate_can_force_the_watchdog(shell):
    hog = "blocks = []\nwhile True:\n    blocks.append(bytearray(20 * 2**20))\n"
    shell.run_cell_magic("isolate", "-o hog -q --memory-budget 200M --memory-enforcement watchdog", hog)
    hog_result = shell.user_ns["hog"]
    assert hog_result.signal == 9 and hog_result.memory_limit["enforced_by"] == "watchdog"
    assert hog_result.watchdog_kills


def test_the_card_opens_with_the_cause(shell):
    from labutils.lab import magic

    shown = magic.isolate_cell("-o seg", "import ctypes\nctypes.string_at(0)\n", shell.user_ns)
    page = shown._repr_html_()
    assert page.index("cause: <code>") < page.index("killed by SIGSEGV"), page
    assert "show the lab's diagnosis" not in page
    # display(result) after %load_ext shows the same card (the extension registers it for RunResult)
    assert "cause: <code>" in shell.display_formatter.format(shell.user_ns["seg"])[0]["text/html"]
    assert str(shown).splitlines()[0].startswith("cause: ")


def test_hide_cause_folds_the_diagnosis_below_the_evidence(shell):
    from labutils.lab import magic

    shown = magic.isolate_cell("-o hid --hide-cause", "import ctypes\nctypes.string_at(0)\n", shell.user_ns)
    assert shell.user_ns["hid"].outcome == "failed"
    page = shown._repr_html_()
    fold = page.index("<details><summary>show the lab's diagnosis</summary>")
    assert page.count("cause: <code>") == 1 and page.index("cause: <code>") > fold, page
    assert page.index("killed by SIGSEGV") < fold  # the evidence is in sight, above the fold
    assert page.rstrip().endswith("</details></div>")  # the fold is the card's last block
    text = str(shown).splitlines()
    assert "What killed it?" in text[0] and text[-1].startswith("the lab's diagnosis: cause: ")


def test_the_card_shows_the_learners_frames_not_the_lab_runner():
    from labutils.lab.card import learner_lines

    tb = ['Traceback (most recent call last):',
          '  File "/x/labutils/runner/bootstrap.py", line 426, in _run_as_main',
          '    exec(code, ns)',
          '  File "/tmp/run/lab_cell.py", line 9, in <module>',
          '    for batch in loader:',
          '  File "/x/labutils/runner/bootstrap.py", line 210, in __next__',
          '    return original_next(self)',
          '           ^^^^^^^^^^^^^^^^^^^',
          '  File "/v/torch/utils/data/dataloader.py", line 733, in __next__',
          '    data = self._next_data()',
          'RuntimeError: DataLoader worker (pid(s) 7) exited unexpectedly',
          '  File "<frozen runpy>", line 88 in _run_code',
          '  File "/x/labutils/runner/zygote.py", line 97 in _become_run']
    kept, dropped = learner_lines(tb)
    assert kept == [tb[0], tb[3], tb[4], tb[8], tb[9], tb[10]] and dropped == len(tb) - len(kept)


def test_a_hang_card_shows_the_stuck_function_without_the_runner(shell):
    from labutils.lab import magic

    cell = "import time\n\n\ndef wait_for_server():\n    time.sleep(60)\n\n\nwait_for_server()\n"
    shown = magic.isolate_cell("-o stuck --timeout 3", cell, shell.user_ns)
    full = shell.user_ns["stuck"].stderr
    assert "labutils/runner/" in full and "wait_for_server" in full  # the runner's dump has both
    page = shown._repr_html_()
    sight = page.split("<details><summary>full stderr, with the lab's frames</summary>")[0]
    assert "in wait_for_server" in sight and "labutils/runner/" not in sight and "frozen runpy" not in sight, sight
    assert "labutils/runner/" in page  # still there, folded


def test_the_magic_takes_every_run_option_of_the_table():
    from labutils.lab import magic
    from labutils.runner.spec import OPTIONS

    flags = {a for action in magic._parser()._actions for a in action.option_strings}
    assert {row.flag for row in OPTIONS if row.flag} <= flags
    assert {"-o", "-q", "--hide-cause"} <= flags


def test_a_cause_the_lab_is_not_sure_of_reads_as_a_guess(shell):
    from labutils.lab import magic

    kill = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"  # a SIGKILL with no memory evidence
    shown = magic.isolate_cell("-o kill9", kill, shell.user_ns)
    d = shell.user_ns["kill9"].diagnosis
    assert d.confidence != "high", d
    assert f"<code>{d.cause}</code>? ({d.confidence} confidence)" in shown._repr_html_()
    worker_segfault = ("import ctypes\nimport torch\nfrom torch.utils.data import DataLoader, Dataset\n\n\n"
                       "class Crash(Dataset):\n    def __len__(self):\n        return 4\n\n"
                       "    def __getitem__(self, i):\n        ctypes.string_at(0)\n\n\n"
                       "if __name__ == '__main__':\n    list(DataLoader(Crash(), num_workers=1))\n")
    sure = magic.isolate_cell("-o sure", worker_segfault, shell.user_ns)
    assert shell.user_ns["sure"].diagnosis.confidence == "high", shell.user_ns["sure"].diagnosis
    assert "<code>native_crash</code></b>" in sure._repr_html_()
