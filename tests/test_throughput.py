"""labutils.kit.throughput: epoch timing, the thread-setting worker_init_fn, the median of measurements."""

import pickle

import pytest

from labutils.kit.fixes import QuarantinedBatch, Skipped
from labutils.kit.throughput import SetThreads, batch_len, median, preload_forkserver, time_epochs


def test_batch_len_reads_tensors_tuples_dicts_and_quarantined_batches():
    torch = pytest.importorskip("torch")
    x = torch.zeros(5, 3)
    assert batch_len(x) == 5
    assert batch_len((x, torch.arange(5))) == 5
    assert batch_len({"image": x, "label": torch.arange(5)}) == 5
    assert batch_len(QuarantinedBatch((x, torch.arange(5)), [])) == 5
    assert batch_len(QuarantinedBatch(None, [Skipped(0, "ValueError", "bad")])) == 0


def test_time_epochs_counts_every_sample_of_every_epoch():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=3)
    steps = []
    rows = time_epochs(loader, epochs=2, step=steps.append)
    assert [r["samples"] for r in rows] == [10, 10]
    assert [r["batches"] for r in rows] == [4, 4]
    assert len(steps) == 8  # the step saw every batch
    for r in rows:
        assert 0 <= r["first_batch_s"] <= r["seconds"]
        assert r["samples_per_s"] > 0  # 7 samples after the first batch


def test_time_epochs_rejects_a_bad_epoch_count():
    with pytest.raises(ValueError, match="epochs"):
        time_epochs([], epochs=0)


def test_set_threads_pickles_sets_the_count_and_remembers_the_old_one():
    torch = pytest.importorskip("torch")
    init = pickle.loads(pickle.dumps(SetThreads(1)))
    before = torch.get_num_threads()
    try:
        init(0)
        assert torch.get_num_threads() == 1
        assert SetThreads.seen == before
    finally:
        torch.set_num_threads(before)
    assert SetThreads(None).threads() >= 1
    with pytest.raises(ValueError):
        SetThreads(0)


def test_median_leaves_out_missing_measurements():
    assert median([None, 4.0, 2.0]) == 3.0
    with pytest.raises(ValueError):
        median([None])


def test_preload_forkserver_records_the_modules_and_starts_nothing_unless_forkserver(monkeypatch):
    from multiprocessing import forkserver

    import labutils.runner.startmethod

    monkeypatch.setattr(forkserver._forkserver, "_preload_modules", [])  # restored after the test
    monkeypatch.setattr(labutils.runner.startmethod, "current", lambda: "fork")
    pid_before = forkserver._forkserver._forkserver_pid
    assert preload_forkserver(["torch", "numpy"]) is None  # no fork server under fork
    assert forkserver._forkserver._preload_modules == ["__main__", "torch", "numpy"]
    assert forkserver._forkserver._forkserver_pid == pid_before
    assert preload_forkserver("torch", start=False) is None
    assert forkserver._forkserver._preload_modules == ["__main__", "torch"]
    with pytest.raises(ValueError, match="module names"):
        preload_forkserver([""])


def test_bench10_steady_counts_batches_after_each_first_one():
    import time as _time

    from torch.utils.data import DataLoader

    from labutils.kit.bench10 import steady

    class Sleepy(list):
        def __getitem__(self, i):
            _time.sleep(0.002)
            return super().__getitem__(i)

    out = steady(DataLoader(Sleepy(range(40)), batch_size=4), 3)
    assert out["batches"] == 3 * (10 - 1)  # the first batch of each epoch is not timed
    assert 100 < out["samples_per_s"] < 600, out  # about 4 samples per 8 ms
