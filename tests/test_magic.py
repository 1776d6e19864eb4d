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
    ("--start-method thread", "invalid choice"),
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
