"""The live lab, headless: the recorder and chart, the knobs a scenario offers, a background run, scores."""

from __future__ import annotations

import csv
import json
import threading
import time

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from labutils.lab.live import LiveRecorder, LiveView, death_text, render_png  # noqa: E402
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


def test_live_view_redraws_while_samples_arrive_and_once_more_at_the_end():
    view = LiveView(interval=0.05)
    rec = view.start("fake run")
    stop = threading.Event()

    def feed():
        t = 0.0
        while not stop.is_set():
            rec.on_sample(_sample(t, 1, "main", batches=int(t * 10)))
            t += 0.05
            time.sleep(0.02)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        deadline = time.monotonic() + 30
        while view.redraws < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        during = view.redraws
        first_image = bytes(view.image.value)
    finally:
        stop.set()
        feeder.join()
    view.stop()
    assert during >= 2, "the chart was redrawn while the run went"
    assert view.redraws > during and "finished" in view.caption.value
    assert bytes(view.image.value).startswith(PNG) and bytes(view.image.value) != first_image


def test_every_declared_knob_is_known_and_read_by_both_scripts():
    for sc in SCENARIOS.values():
        assert set(sc.knobs) <= set(KNOBS), sc.id
        for which in ("broken", "fixed"):
            read = script_knob_defaults(sc.path(which))
            missing = [k for k in sc.knobs if k in LOADER_KNOBS and k not in read]
            assert not missing, f"{sc.id} ({which}) declares {missing} but its script does not read them"


def test_the_lab_offers_only_the_declared_knobs_with_the_scripts_defaults():
    ui = LabUI("shm_exhausted", "broken")
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
    ui = LabUI()
    for name, widget in ui.knob_widgets.items():
        assert widget.style.description_width == "initial", name


def test_diff_shows_what_the_fix_changed():
    sc = SCENARIOS["fd_limit"]
    text = script_diff_html(sc.path("broken"), sc.path("fixed"))
    assert "kept.append" in text and "labels.extend" in text and "<pre" in text


def test_a_background_run_moves_the_chart_and_the_knob_reaches_the_script():
    ui = LabUI("ok", "broken")
    ui.num_workers.value = 3
    ui.prediction.value = "ok"
    assert ui.start()
    assert not ui.start(), "a second Run while one goes is refused"
    assert "already going" in ui.status.value and ui.button.disabled
    images = set()
    deadline = time.monotonic() + 120
    while ui.busy and time.monotonic() < deadline:
        if ui.live.image.value:
            images.add(bytes(ui.live.image.value))
        time.sleep(0.1)
    result = ui.wait(timeout=120)
    assert result is not None and result.outcome == "ok", ui.status.value
    assert len(result.dataloader_workers) >= 3, "LAB_NUM_WORKERS=3 reached the script"
    assert ui.live.recorder.snapshot()["n_samples"] >= 2
    assert ui.live.recorder.first_sample_s < 5
    assert len(images) >= 1 and not ui.button.disabled
    assert ui.answers[-1]["correct"] and "Score: 1 of 1" in ui.score.value


def test_a_broken_guess_is_scored_and_exported(tmp_path):
    ui = LabUI("worker_exception", "broken")
    ui.learner.value = "ada"
    ui.prediction.value = "oom_killed"
    result = ui.run()
    assert result.cause == "worker_exception"
    assert "not quite" in ui.verdict.value and "worker_exception" in ui.verdict.value
    assert ui.prediction.value == "", "the guess is cleared for the next run"
    path = ui.export_answers(str(tmp_path / "answers.csv"))
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["learner"] == "ada" and rows[0]["diagnosed"] == "worker_exception"
    assert rows[0]["correct"] == "False"
    path = ui.export_answers(str(tmp_path / "answers.json"))
    assert json.loads(open(path).read())[0]["predicted"] == "oom_killed"


def test_own_code_runs_isolated_and_bad_input_says_what_to_do(tmp_path):
    ui = LabUI()
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
    assert ui.live.redraws >= 1 and "finished" in ui.live.caption.value


def test_a_long_run_is_drawn_from_a_bounded_number_of_points():
    rec = LiveRecorder()
    for i in range(3000):  # 60 s of a main process and two workers at 4 samples a second, and more
        rec.on_sample(_sample(i * 0.02, 1 + i % 3, "main" if i % 3 == 0 else "worker", batches=i))
    t0 = time.monotonic()
    png = render_png(rec, "long")
    assert png.startswith(PNG) and time.monotonic() - t0 < 30
