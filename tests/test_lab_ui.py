"""The ipywidgets lab, driven headlessly: set values, call the handlers, read the result."""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets")

from labutils.lab.widget import LabUI, lab  # noqa: E402


def test_choosing_a_scenario_loads_its_limits():
    ui = LabUI("oom_killed")
    assert ui.memory_budget.value == ui.scenarios["oom_killed"].broken_options.memory_budget
    ui.scenario.value = "fd_limit"
    assert ui.nofile.value == str(ui.scenarios["fd_limit"].broken_options.nofile)
    ui.show_code.value = True
    assert ui.code.outputs, "the script text is shown when asked for"


def test_run_broken_then_fixed_gives_the_expected_cause_and_ok():
    ui = LabUI("worker_exception", "broken")
    broken = ui.run()
    assert broken.cause == "worker_exception"
    assert "worker_exception" in ui.status.value
    ui.which.value = "fixed"
    fixed = ui.run()
    assert fixed.outcome == "ok" and fixed.cause == "ok"
    assert ui.last is fixed and not ui.button.disabled
    assert ui.output.outputs, "the result card is shown below the controls"


def test_bad_input_is_reported_in_the_status_line():
    ui = LabUI("fd_limit")  # offers the open-files limit
    ui.nofile.value = "many"
    assert ui.run() is None
    assert "not a whole number" in ui.status.value
    ui.scenario.value = "oom_killed"  # offers the memory budget
    ui.memory_budget.value = "lots"
    assert ui.run() is None and "lots" in ui.status.value


def test_lab_returns_a_widget_and_rejects_unknown_scenarios():
    import ipywidgets

    assert isinstance(lab(), ipywidgets.VBox)
    with pytest.raises(KeyError, match="unknown scenario"):
        LabUI("nope")
