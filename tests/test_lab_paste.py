"""The lab's paste box, headless: set the text, click, read the report (the same diagnosis as --log)."""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets")

from labutils.diagnosis.diagnose import explain  # noqa: E402
from labutils.lab.paste import paste_panel, report_html  # noqa: E402

TEXT = ("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    for b in loader:\n"
        "  File \"/x/torch/utils/data/dataloader.py\", line 1505, in _next_data\n    idx, data = self._get_data()\n"
        "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.\n"
        "Out of memory: Killed process 4242 (pt_data_worker)\n")


def test_click_shows_the_same_cause_as_the_log_command():
    box = paste_panel()
    area, button, out = box.children
    assert "Paste a log" in out.value
    area.value = TEXT
    button.click()
    d = explain(TEXT)
    assert d.cause == "oom_killed" and d.confidence == "high"
    assert "oom_killed" in out.value and "high confidence" in out.value
    area.value = "just a warning: UserWarning: something\n"
    button.click()
    assert "no DataLoader failure in this text" in out.value and "oom_killed" not in out.value


def test_bad_paste_is_one_line():
    assert "Paste a log" in report_html("   \n")
    assert "df -h /dev/shm" in report_html("RuntimeError: DataLoader worker (pid 7) is killed by signal: Bus error.")


def test_the_lab_has_the_paste_tab_beside_your_code():
    import labutils.lab.widget as widget

    ui = widget.LabUI()
    titles = list(ui.tabs.titles)
    assert titles[titles.index("Your code") + 1] == "Paste your error"
    area, button, out = ui.tabs.children[titles.index("Paste your error")].children
    area.value = TEXT
    button.click()
    assert "oom_killed" in out.value and "high confidence" in out.value
