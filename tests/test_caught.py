"""labutils.kit.caught: a chain caught inside a script reads like a run's own (classify, check_death)."""

from types import SimpleNamespace

import pytest

from labutils.kit.caught import caught, chain
from labutils.kit.deaths import check_death, classify


def _raise_wrapped():
    try:
        raise RuntimeError("DataLoader worker (pid 41) is killed by signal: Terminated.")
    except RuntimeError as inner:
        raise RuntimeError("DataLoader worker (pid(s) 41) exited unexpectedly") from inner


def test_chain_outermost_first_with_cause():
    try:
        _raise_wrapped()
    except RuntimeError as exc:
        records = chain(exc)
    assert [r["type"] for r in records] == ["RuntimeError", "RuntimeError"]
    assert records[0]["message"].endswith("exited unexpectedly") and "Terminated" in records[1]["message"]
    assert chain(None) == []


def test_caught_feeds_check_death():
    try:
        _raise_wrapped()
    except RuntimeError as exc:
        records = chain(exc)
    worker = SimpleNamespace(pid=41, signal=15, exitcode=-15, status="killed by SIGTERM")
    run = SimpleNamespace(dataloader_workers=[worker], loader_events=[
        {"event": "iter", "num_workers": 2, "start_method": "fork"}])
    view = caught(run, records)
    assert classify(view).shape == "handler_inside"
    assert check_death(view, signal=15).pids == (41,)
    with pytest.raises(AssertionError):
        check_death(view, signal=9)  # no worker died of SIGKILL


def test_caught_refuses_what_chain_does_not_return():
    with pytest.raises(ValueError, match="records must be"):
        caught(SimpleNamespace(), [{"type": "RuntimeError"}])
    assert caught(SimpleNamespace(), None).exceptions == []
