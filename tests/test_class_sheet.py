"""`python -m labutils class-sheet`: 20 learners' exports, written by the lab's own export code, merged in
one screen; bad files (another tool's CSV, an empty file, broken JSON, a learner who comes twice) named and
skipped, never a traceback. The sheets are generated (seeded), not played: what is tested is the merge."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter

from labutils.lab import game
from labutils.lab.classsheet import CODES, merge
from labutils.scenarios import SCENARIOS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAUSES = sorted(SCENARIOS)


def _sheets(folder, n=20, seed=7) -> dict:
    """``n`` exports (every third as JSON), and the truth they hold: the confusion counts, the numbers."""
    rng = random.Random(seed)
    truth = {"confusion": Counter(), "close": 0, "numbers": 0, "best_nofile": None}
    paths = []
    for i in range(n):
        learner = f"learner {i:02d}"
        sheet = game.ClassSheet()
        dealt = game.deal(SCENARIOS, learner)
        for case, sid in list(dealt.cases.items())[: rng.randint(3, 8)]:
            guess = sid if rng.random() < 0.6 else rng.choice(CAUSES)
            a = game.Answer(learner, case, guess, predicted_batches=float(rng.randint(5, 80)))
            a.scenario, a.diagnosed, a.revealed, a.correct = sid, sid, True, guess == sid
            a.observed_batches = rng.randint(5, 80)
            game.score_numbers(a)
            sheet.answers.append(a)
            truth["confusion"][(sid, guess)] += 1
            truth["numbers"] += 1
            truth["close"] += bool(a.batches_close)
        nofile = rng.choice([224, 240, 256, 320])
        sheet.attempts.append({"learner": learner, "challenge": "fd_nofile", "case": "Case X", "knobs": {},
                               "changed": {"nofile": str(nofile)}, "score": nofile, "success": True,
                               "counted": True, "why": "", "time": ""})
        truth["best_nofile"] = min(truth["best_nofile"] or nofile, nofile)
        ext = ".json" if i % 3 == 2 else ".csv"
        paths.append(sheet.export(str(folder / game.export_name(learner).replace(".csv", ext))))
    truth["paths"] = paths
    return truth


def test_twenty_sheets_merge_into_one_screen(tmp_path):
    truth = _sheets(tmp_path)
    assert len(set(truth["paths"])) == 20, "each learner's file has its own name"
    report = merge(truth["paths"])
    assert len(report.learners) == 20 and report.skipped == []
    assert report.confusion() == truth["confusion"]
    text = report.text()
    lines = text.splitlines()
    assert len(lines) <= 50 and max(map(len, lines)) <= 120, (len(lines), max(map(len, lines)))  # one screen
    head = next(i for i, line in enumerate(lines) if line.startswith("Confusion"))
    for sid in {a for a, _ in truth["confusion"]}:  # a row per real cause, its diagonal as "right"
        row = next(line for line in lines[head:] if line.startswith(sid + " "))
        right, total = truth["confusion"][(sid, sid)], sum(v for (a, _), v in truth["confusion"].items() if a == sid)
        assert row.endswith(f"{right}/{total}"), row
    assert f"batches: {truth['close']} of {truth['numbers']} close" in text, text
    assert f"fd_nofile: {truth['best_nofile']:g} by" in text, text
    assert "Most often missed:" in text and CODES["fd_limit"] in text


def test_bad_files_are_named_and_skipped(tmp_path):
    truth = _sheets(tmp_path, n=3)
    other = tmp_path / "grades.csv"
    other.write_text("name,score\nada,9\n")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    broken = tmp_path / "broken.json"
    broken.write_text('{"predictions": [')
    again = tmp_path / "lab_answers_learner_00_again.csv"
    again.write_bytes(open(truth["paths"][0], "rb").read())
    binary = tmp_path / "photo.csv"
    binary.write_bytes(b"\xff\xd8\xff\xe0" + bytes(range(256)))
    missing = tmp_path / "nope.csv"
    report = merge([*truth["paths"], str(other), str(empty), str(broken), str(again), str(binary), str(missing)])
    why = dict(report.skipped)
    assert len(report.learners) == 3 and len(why) == 6, why
    assert "another tool" in why["grades.csv"] and why["empty.csv"] == "empty", why
    assert "broken JSON" in why["broken.json"] and "not UTF-8" in why["photo.csv"], why
    assert "learner 00 already read from lab_answers_learner_00.csv" in why[again.name], why
    assert "cannot be read" in why["nope.csv"], why
    for name in why:
        assert f"skipped {name}: " in report.text()


def test_the_command_prints_the_sheet_and_says_when_nothing_could_be_read(tmp_path):
    truth = _sheets(tmp_path, n=2)
    (tmp_path / "empty.csv").write_text("")
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "labutils", "class-sheet"]
    done = subprocess.run(cmd + [str(tmp_path / "*.csv"), str(tmp_path / "*.json")], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0 and "Class sheet: 2 learners" in done.stdout, done.stdout + done.stderr
    assert "skipped empty.csv: empty" in done.stdout and "Traceback" not in done.stderr
    bad = subprocess.run(cmd + [str(tmp_path / "empty.csv")], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 1 and "no lab export" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert len(truth["paths"]) == 2
