"""``explain(text)`` on logs pasted into public issue threads (tests/logs/: each file names its thread, the
resolution the thread states, the cause that resolution means and whether the pasted text alone decides it).

Every log whose text decides its cause is named right, and no wrong answer says ``high``. The counts are
printed (``pytest -s``) for the README."""

from __future__ import annotations

import os

import pytest

from labutils.diagnosis.diagnose import CAUSES, explain

FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "logs")
FILES = sorted(f for f in os.listdir(FOLDER) if f.endswith(".txt"))


def read(name: str) -> tuple:
    """``(header fields, log text)`` of one file of tests/logs."""
    with open(os.path.join(FOLDER, name), encoding="utf-8") as fh:
        head, sep, body = fh.read().partition("# ---\n")
    assert sep, f"{name}: no '# ---' line after the header"
    fields = {}
    for line in head.splitlines():
        key, _, value = line.lstrip("# ").partition(": ")
        fields[key] = value.strip()
    return fields, body


def test_the_corpus_has_thirty_logs_from_distinct_threads_each_with_its_address_and_resolution():
    sources = []
    for name in FILES:
        fields, body = read(name)
        assert fields.get("source", "").startswith("https://github.com/"), name
        assert fields.get("resolution (as the thread states it, in our words)"), name
        assert fields.get("expected") in CAUSES and fields.get("text decides") in ("yes", "no"), name
        assert body.strip(), name
        sources.append(fields["source"])
    assert len(set(sources)) == len(sources) >= 30, len(set(sources))


@pytest.mark.parametrize("name", FILES)
def test_a_public_log(name):
    fields, body = read(name)
    d = explain(body)
    assert d.source == "log"
    if fields["text decides"] == "yes":
        assert d.cause == fields["expected"], f"{name}: {d}"
    elif d.cause != fields["expected"]:
        assert d.confidence != "high", f"{name}: a wrong answer with high confidence:\n{d}"


def test_counts_for_the_readme(capsys):
    right = decided = decided_right = wrong_high = 0
    for name in FILES:
        fields, body = read(name)
        d = explain(body)
        ok = d.cause == fields["expected"]
        right += ok
        if fields["text decides"] == "yes":
            decided += 1
            decided_right += ok
        wrong_high += (not ok) and d.confidence == "high"
    with capsys.disabled():
        print(f"\npublic logs: {len(FILES)}; named right {right}; text decides {decided}, of those right "
              f"{decided_right}; wrong with high confidence {wrong_high}")
    assert decided_right == decided and wrong_high == 0
