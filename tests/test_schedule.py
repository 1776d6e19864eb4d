"""The suite's xdist scheduler: its groups keep a notebook together and split a file's start-method pass."""

import json
import os

from labutils.testing.xdist_schedule import DURATIONS, load_durations, split_scope

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_a_notebooks_cells_stay_in_one_group_per_pass():
    assert split_scope("notebooks/07_x.ipynb::Cell 0", ("forkserver",)) == "notebooks/07_x.ipynb"
    assert (
        split_scope("notebooks/07_x.ipynb[forkserver]::Cell 12", ("forkserver",)) == "notebooks/07_x.ipynb[forkserver]"
    )


def test_the_extra_start_method_pass_of_a_test_file_is_its_own_group():
    methods = ("forkserver",)
    assert split_scope("tests/test_s.py::test_a[forkserver-hang]", methods) == "tests/test_s.py::forkserver"
    assert split_scope("tests/test_s.py::test_a[forkserver]", methods) == "tests/test_s.py::forkserver"
    assert split_scope("tests/test_s.py::test_a[default-hang]", methods) == "tests/test_s.py"
    assert split_scope("tests/test_s.py::test_a[spawn]", methods) == "tests/test_s.py"  # a test's own parameter
    assert split_scope("tests/test_s.py::test_b", methods) == "tests/test_s.py"


def test_the_durations_file_names_groups_that_exist():
    durations = load_durations(ROOT)
    assert len(durations) > 20, "tests/durations.json is missing or empty: python tests/update_durations.py"
    with open(os.path.join(ROOT, DURATIONS), encoding="utf-8") as fh:
        assert json.load(fh) == {k: v for k, v in durations.items()}
    for group in durations:
        path = group.split("::")[0].split("[")[0]
        assert os.path.isfile(os.path.join(ROOT, path)), f"{group}: no such file (refresh tests/durations.json)"
