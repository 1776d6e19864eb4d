"""labutils.kit.measure: the start method a run used, and the per-worker memory probe of notebook 04."""

import textwrap

import labutils
from labutils.kit.measure import collate_with_memory, run_start_method
from labutils.runner.result import RunResult

PROBE = textwrap.dedent('''
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from labutils.kit.measure import collate_with_memory, note_birth, run_batches

    if __name__ == "__main__":
        loader = DataLoader(TensorDataset(torch.arange(12.0)), batch_size=4, num_workers=2,
                            multiprocessing_context="spawn", worker_init_fn=note_birth,
                            collate_fn=collate_with_memory)
        run_batches(loader, 2)
''')


def test_run_start_method_reads_the_iterator_record():
    events = [{"event": "iter", "num_workers": 0, "start_method": "fork"},
              {"event": "iter", "num_workers": 2, "start_method": "spawn"}]
    assert run_start_method(RunResult(outcome="ok", loader_events=events)) == "spawn"
    assert run_start_method(RunResult(outcome="ok")) is None


def test_memory_probe_reports_each_worker_from_a_spawned_run():
    r = labutils.run_isolated(PROBE, timeout=120)
    assert r.ok, r
    assert r.leftover_files == [] and r.stray_processes == []  # the run's own record: nothing left
    assert run_start_method(r) == "spawn"
    record = r.values["mem"]
    assert record["items"] == 8 and record["first"] == [[0.0, 1.0, 2.0, 3.0]]
    reports = record["reports"]
    assert {rep["worker"] for rep in reports} == {0, 1}  # a batch from each worker
    for rep in reports:
        assert rep["birth_uss"] and rep["uss"] >= 0.5 * rep["birth_uss"]  # measured in the worker itself
        assert rep["rss"] >= rep["uss"]


def test_collate_outside_a_worker_still_collates():
    batch, mem = collate_with_memory([1, 2, 3])
    assert batch.tolist() == [1, 2, 3] and mem["worker"] is None and mem["rss"] > 0
