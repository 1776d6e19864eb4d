"""find_crashing_inputs: the real crashing function, one throwaway process per crash."""

import textwrap

import pytest

from labutils.kit.triage import find_crashing_inputs

DECODER = textwrap.dedent('''
    import ctypes
    import sys
    import time


    def decode(item):
        if item.startswith("bad"):
            ctypes.string_at(0)  # SIGSEGV, as a C decoder with a memory bug
        if item == "exit":
            sys.exit(3)
        if item == "hang":
            time.sleep(60)
        if item == "raise":
            raise ValueError("a Python error")
        return len(item)
''')


@pytest.fixture
def decoder(tmp_path):
    (tmp_path / "decoder.py").write_text(DECODER)
    return {"PYTHONPATH": str(tmp_path)}


def test_finds_exactly_the_crashing_items(decoder, no_leaks):
    items = ["ok1", "bad1", "ok2", "ok3", "bad2", "bad3", "ok4"]
    crashes = find_crashing_inputs("decoder:decode", items, env=decoder)
    assert [(c.index, c.item, c.how) for c in crashes] == [
        (1, "bad1", "SIGSEGV"), (4, "bad2", "SIGSEGV"), (5, "bad3", "SIGSEGV")]
    assert "Fatal Python error" not in crashes[0].stderr_tail  # no faulthandler: a bare native death


def test_exit_hang_and_exception_are_named(decoder, no_leaks):
    crashes = find_crashing_inputs("decoder:decode", ["exit", "ok", "hang", "raise", "ok"], env=decoder,
                                   item_timeout=1.0)
    assert [(c.index, c.how) for c in crashes] == [(0, "exit code 3"), (2, "hang"), (3, "exit code 1")]
    assert "ValueError: a Python error" in crashes[2].stderr_tail


def test_no_crash_and_bad_input(decoder):
    assert find_crashing_inputs("decoder:decode", ["a", "b"], env=decoder) == []
    assert find_crashing_inputs("decoder:decode", [], env=decoder) == []
    with pytest.raises(ValueError, match="module:function"):
        find_crashing_inputs("decoder.decode", ["a"], env=decoder)
    with pytest.raises(ValueError, match="JSON"):
        find_crashing_inputs("decoder:decode", [object()], env=decoder)
    with pytest.raises(RuntimeError, match="outside any item"):
        find_crashing_inputs("no_such_module:decode", ["a"], env=decoder)
