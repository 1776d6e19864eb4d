"""The live lab, headless: the recorder and chart, the knobs a scenario offers, a background run, scores."""

from __future__ import annotations

import csv
import json
import threading
import time

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")
pytest.importorskip("bqplot")

from labutils.lab.chart import LiveChart, parse_size_mib  # noqa: E402
from labutils.lab.live import LiveRecorder, death_text, render_png  # noqa: E402
from labutils.lab.widget import LabUI, script_diff_html, script_knob_defaults  # noqa: E402
from labutils.scenarios import KNOBS, LOADER_KNOBS, SCENARIOS  # noqa: E402

PNG = b"\x89PNG"


def _sample(t, pid, role, rss=100 << 20, fds=10, batches=None):
    return {
        "t": t,
        "pid": pid,
        "role": role,
        "name": "python",
        "rss": rss,
        "uss": rss // 2,
        "fds": fds,
        "shm_bytes": 0,
        "batches": batches,
    }


def test_the_final_batch_count_moves_the_batch_line_and_no_memory_line():
    rec = LiveRecorder()
    rec.on_sample(_sample(0.1, 10, "main", batches=1))
    final = dict(_sample(0.3, 10, "main", batches=56), rss=None, uss=None, fds=None, shm_bytes=None, final=True)
    rec.on_sample(final)
    snap = rec.snapshot()
    assert snap["batches"] == ([0.1, 0.3], [1, 56])
    assert snap["series"]["main"]["t"] == [0.1] and snap["series"]["main"]["rss"] == [100]
    assert render_png(rec, "test").startswith(PNG)


def test_recorder_names_processes_and_places_deaths_on_the_run_clock():
    rec = LiveRecorder()
    rec.on_sample(_sample(0.1, 10, "main", batches=0))
    rec.on_sample(_sample(0.1, 11, "worker"))
    rec.on_sample(_sample(0.1, 12, "worker"))
    rec.on_sample(_sample(0.4, 10, "main", fds=20, batches=3))
    # events carry wall time; the recorder puts them on the samples' clock
    rec.on_event(
        {
            "t": time.time(),
            "pid": 12,
            "role": "worker",
            "name": "python",
            "exitcode": None,
            "signal": 9,
            "by": "watchdog",
        }
    )
    snap = rec.snapshot()
    assert set(snap["series"]) == {"main", "worker 0", "worker 1"}
    assert snap["series"]["main"]["fds"] == [10, 20] and snap["batches"] == ([0.1, 0.4], [0, 3])
    ((t, text),) = snap["deaths"]
    assert 0 <= t < 5 and text == "worker 1 died: SIGKILL (killed by the lab's memory watchdog)"
    assert rec.first_sample_s is not None and rec.first_sample_s >= 0
    assert render_png(rec, "test").startswith(PNG)


def test_death_text_says_exit_codes_signals_and_who():
    assert death_text({"pid": 5, "role": "worker", "exitcode": 2, "signal": None}) == "worker 5 died: exit code 2"
    assert "SIGSEGV" in death_text({"signal": 11}, "worker 0")
    assert "OOM killer" in death_text({"signal": 9, "by": "kernel_oom"}, "worker 0")


def test_an_empty_run_still_draws():
    assert render_png(LiveRecorder(), "nothing yet").startswith(PNG)


def _feed(rec, stop, period=0.02):
    t = 0.0
    while not stop.is_set():
        rec.on_sample(_sample(t, 1, "main", fds=10 + int(t * 20), batches=int(t * 10)))
        rec.on_sample(_sample(t, 2, "worker"))
        t += 0.05
        time.sleep(period)


def test_the_chart_is_data_for_the_browser_updated_several_times_a_second():
    chart = LiveChart()
    rec = chart.start("fake run", limits={"nofile": 128, "memory_budget": "800M", "shm_size": "8M"})
    changes = []
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(rec, stop))
    feeder.start()
    try:
        deadline = time.monotonic() + 30
        while len(chart.update_times) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        batches = chart.panels["batches"].lines[(0, "batches")]
        batches.observe(lambda c: changes.append(time.monotonic()), names="y")  # one model update each
        time.sleep(1.5)
    finally:
        stop.set()
        feeder.join()
    chart.stop()
    rate = (len(changes) - 1) / (changes[-1] - changes[0])
    print(f"chart model updates: {rate:.1f} a second (loaded machine)")
    assert rate >= 4, rate
    assert "finished" in chart.caption.value and chart.updates_per_second() >= 4
    # each limit is a line on its panel, at its value
    assert list(chart.panels["fds"].limit.y) == [128, 128] and chart.panels["fds"].limit.visible
    assert list(chart.panels["mem"].limit.y) == [800, 800] and list(chart.panels["shm"].limit.y) == [8, 8]
    assert max(chart.panels["fds"].lines[(0, "main")].y) > 10, "the fds line moved"
    assert chart.png().startswith(PNG), "the PNG stays for export"


def test_an_overlay_keeps_the_first_run_and_draws_the_second_dashed():
    chart = LiveChart()
    first = chart.start("broken")
    first.on_sample(_sample(0.1, 1, "main", batches=1))
    chart.stop()
    second = chart.start("fixed", overlay=True)
    second.on_sample(_sample(0.2, 7, "main", batches=2))
    chart.stop()
    keys = set(chart.panels["batches"].lines)
    assert keys == {(0, "batches"), (1, "batches")}
    assert chart.panels["batches"].lines[(1, "batches")].line_style == "dashed"
    assert chart.panels["batches"].lines[(0, "batches")].labels == ["batches (broken)"]
    assert not chart.panels["fds"].limit.visible, "no limit given: no limit line"
    chart.start("alone")
    assert chart.panels["batches"].lines == {}, "without overlay the chart starts empty"
    chart.stop()


def test_deaths_are_vertical_lines_on_the_chart():
    chart = LiveChart()
    rec = chart.start("death")
    rec.on_sample(_sample(0.1, 1, "main"))
    rec.on_event({"t": time.time(), "pid": 1, "role": "worker", "exitcode": None, "signal": 11})
    chart.stop()
    deaths = chart.panels["mem"].deaths
    assert deaths.visible and np.atleast_2d(deaths.x).shape == (1, 2) and "SIGSEGV" in chart.deaths_text.value


def test_every_declared_knob_is_known_and_read_by_both_scripts():
    for sc in SCENARIOS.values():
        assert set(sc.knobs) <= set(KNOBS), sc.id
        for which in ("broken", "fixed"):
            read = script_knob_defaults(sc.path(which))
            missing = [k for k in sc.knobs if k in LOADER_KNOBS and k not in read]
            assert not missing, f"{sc.id} ({which}) declares {missing} but its script does not read them"


def test_the_lab_offers_only_the_declared_knobs_with_the_scripts_defaults():
    ui = LabUI("shm_exhausted", "broken", mystery=False)
    assert ui.offered_knobs() == tuple(k for k in ui.knob_widgets if k in SCENARIOS["shm_exhausted"].knobs)
    assert ui.knob_box.children == tuple(ui.knob_widgets[k] for k in ui.offered_knobs())
    assert (ui.batch_size.value, ui.prefetch_factor.value) == (4, 2)
    ui.which.value = "fixed"  # the fixed script's own defaults
    assert (ui.batch_size.value, ui.prefetch_factor.value) == (2, 1)
    assert ui.knob_env() == {"LAB_NUM_WORKERS": "2", "LAB_BATCH_SIZE": "2", "LAB_PREFETCH_FACTOR": "1"}
    ui.scenario.value = "hang"
    assert "num_workers" not in ui.offered_knobs() and ui.knob_env() == {}
    assert ui.options()["stall"] == 15.0
    ui.scenario.value = "ok"
    ui.pin_memory.value = True
    assert ui.knob_env()["LAB_PIN_MEMORY"] == "1" and ui.knob_env()["LAB_PERSISTENT_WORKERS"] == "0"


def test_labels_are_not_cut_off():
    ui = LabUI(mystery=False)
    for name, widget in ui.knob_widgets.items():
        assert widget.style.description_width == "initial", name


def test_diff_shows_what_the_fix_changed():
    sc = SCENARIOS["fd_limit"]
    text = script_diff_html(sc.path("broken"), sc.path("fixed"))
    assert "kept.append" in text and "labels.extend" in text and "<pre" in text


def test_a_background_run_moves_the_chart_and_the_knob_reaches_the_script():
    ui = LabUI("ok", "broken", mystery=False)
    ui.num_workers.value = 3
    ui.prediction.value = "ok"
    assert ui.start()
    assert not ui.start(), "a second Run while one goes is refused"
    assert "already going" in ui.status.value and ui.button.disabled
    seen = set()
    deadline = time.monotonic() + 120
    while ui.busy and time.monotonic() < deadline:
        line = ui.live.panels["batches"].lines.get((0, "batches"))
        if line is not None:
            seen.add(tuple(line.y))
        time.sleep(0.1)
    result = ui.wait(timeout=120)
    assert result is not None and result.outcome == "ok", ui.status.value
    assert len(result.dataloader_workers) >= 3, "LAB_NUM_WORKERS=3 reached the script"
    assert ui.live.recorder.snapshot()["n_samples"] >= 2
    assert ui.live.recorder.first_sample_s < 5
    assert len(seen) >= 2, "the batches line changed while the run went"
    assert not ui.button.disabled
    assert ui.answers[-1].correct and "Score: 1 of 1" in ui.score.value


def test_a_wrong_guess_is_scored_and_exported(tmp_path):
    ui = LabUI("worker_exception", "broken", mystery=False)
    ui.learner.value = "ada"
    ui.prediction.value = "oom_killed"
    result = ui.run()
    assert result.cause == "worker_exception"
    assert "not this time" in ui.verdict.value and "worker_exception" in ui.verdict.value
    assert ui.prediction.value == "", "the guess is cleared for the next run"
    path = ui.export_answers(str(tmp_path / "answers.csv"))
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["learner"] == "ada" and rows[0]["diagnosed"] == "worker_exception"
    assert rows[0]["correct"] == "False"
    path = ui.export_answers(str(tmp_path / "answers.json"))
    assert json.loads(open(path).read())["predictions"][0]["predicted"] == "oom_killed"


def test_a_real_run_updates_the_chart_at_least_four_times_a_second():
    """The rate the browser is sent while a real isolated run goes (a loader that takes ~3 s)."""
    ui = LabUI(mystery=False)
    ui.user_code.value = SLOW_LOADER
    result = ui.run_own()
    rate = ui.live.updates_per_second()
    print(f"chart updates while the run went: {rate:.1f} a second over {len(ui.live.update_times)} updates "
          f"({result.wall_time:.1f} s run, loaded machine)")
    assert result.outcome == "ok", result.cause
    assert rate >= 4, rate


SLOW_LOADER = """
import time
import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.zeros(1000)


if __name__ == "__main__":
    for batch in DataLoader(Slow(), batch_size=2, num_workers=2):
        pass
"""


def test_own_code_runs_isolated_and_bad_input_says_what_to_do(tmp_path):
    ui = LabUI(mystery=False)
    assert ui.run_own() is None and "paste a script" in ui.status.value
    ui.user_path.value = str(tmp_path / "missing.py")
    assert ui.run_own() is None and "is not a file" in ui.status.value
    ui.user_code.value = "print(1)"
    assert ui.run_own() is None and "not both" in ui.status.value
    script = tmp_path / "mine.py"
    script.write_text("import sys\nprint('quick')\nsys.exit(3)\n")
    ui.user_code.value = ""
    ui.user_path.value = str(script)
    result = ui.run_own()
    assert result.outcome == "failed" and result.returncode == 3 and "quick" in result.stdout
    assert ui.live.updates >= 1 and "finished" in ui.live.caption.value


def test_a_long_run_is_drawn_from_a_bounded_number_of_points():
    rec = LiveRecorder()
    for i in range(3000):  # 60 s of a main process and two workers at 4 samples a second, and more
        rec.on_sample(_sample(i * 0.02, 1 + i % 3, "main" if i % 3 == 0 else "worker", batches=i))
    t0 = time.monotonic()
    png = render_png(rec, "long")
    assert png.startswith(PNG) and time.monotonic() - t0 < 30


def test_sizes_read_as_mib():
    assert parse_size_mib("800M") == 800 and parse_size_mib("1G") == 1024 and parse_size_mib("8MiB") == 8
    assert parse_size_mib(str(8 << 20)) == 8 and parse_size_mib("") is None and parse_size_mib("lots") is None
