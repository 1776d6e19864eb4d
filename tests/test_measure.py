"""labutils.kit.measure: the start method a run used, and the per-worker memory probe of notebook 04."""

import signal
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


def _info(pid, exitcode, **kw):
    from labutils.runner.result import ProcessInfo
    return ProcessInfo(pid=pid, role="dataloader_worker", exitcode=exitcode, **kw)


def test_shm_left_reads_the_runs_own_ledger_not_the_machine():
    from labutils.kit.measure import shm_left
    r = RunResult(outcome="ok", shm_created=["sem.mp-abc", "torch_12_1_0"], shm_removed=["sem.mp-abc"],
                  leftover_files=["torch_12_2_0"])
    assert shm_left(r) == ["sem.mp-abc", "torch_12_1_0", "torch_12_2_0"]
    # a semaphore recorded as created and unlinked by multiprocessing is not "left"
    assert shm_left(RunResult(outcome="ok", shm_created=["sem.mp-abc"])) == []
    assert shm_left(RunResult(outcome="ok")) == []


def test_unended_workers_flags_only_unrecorded_endings():
    from labutils.kit.measure import unended_workers
    r = RunResult(outcome="failed", workers=[_info(1, 0), _info(2, -9), _info(3, None)])
    assert unended_workers(r) == ["dataloader_worker 3: " + _info(3, None).status]


#: what python 3.11 printed in a spawn run of notebook 03 (pids shortened): a worker still importing was
#: killed by multiprocessing's exit handler, and PyTorch's SIGCHLD handler raised inside its join
_EXIT_JOIN_RAISED = """Exception ignored in atexit callback: <function _exit_function at 0x7f9fe8880400>
Traceback (most recent call last):
  File "/usr/lib/python3.11/multiprocessing/util.py", line 357, in _exit_function
    p.join()
  File "/usr/lib/python3.11/site-packages/torch/utils/data/_utils/signal_handling.py", line 73, in handler
    _error_if_any_worker_fails()
RuntimeError: DataLoader worker (pid 7953) is killed by signal: Terminated.
"""


def test_a_worker_pytorch_left_running_at_exit_is_not_unended_nor_crashed():
    from labutils.kit.measure import crashed_workers, unended_workers
    left = _info(1, None, stopped_by_lab=True)
    ended_alone = _info(4, None)  # exited after the main process, its status reaped by nobody of the run
    ws = [left, _info(2, -signal.SIGTERM), ended_alone]
    explained = RunResult(outcome="failed", workers=ws, stderr="...\n" + _EXIT_JOIN_RAISED)
    assert unended_workers(explained) == [] and crashed_workers(explained) == []
    assert left.status.startswith("still running when the run ended; the lab stopped it")
    # without PyTorch's error at exit, a worker the lab had to stop is flagged (and counts as not clean)
    bare = RunResult(outcome="failed", workers=ws, stderr="")
    flagged = ["dataloader_worker 1: " + left.status, "dataloader_worker 4: " + ended_alone.status]
    assert unended_workers(bare) == flagged and crashed_workers(bare) == flagged
    # a crash signal is a crash, whatever the stderr says
    segv = RunResult(outcome="failed", workers=[_info(3, -signal.SIGSEGV)], stderr=_EXIT_JOIN_RAISED)
    assert crashed_workers(segv) == ["dataloader_worker 3: " + _info(3, -signal.SIGSEGV).status]


def test_echoes_are_socket_errors_in_the_fd_handover_only():
    from labutils.kit.measure import echoes
    from labutils.runner.result import ExceptionInfo
    echo = ExceptionInfo(type="ConnectionResetError", message="reset", traceback="in rebuild_storage_fd")
    other = ExceptionInfo(type="ConnectionResetError", message="reset", traceback="in my_code")
    eof = ExceptionInfo(type="EOFError", message="", traceback="File ... in recvfds")
    assert echoes(RunResult(outcome="failed", exceptions=[echo, other, eof])) == [echo, eof]


def test_kernel_max_usage_only_where_the_kernel_enforced():
    from labutils.kit.measure import kernel_max_usage
    kernel = {"enforced_by": "kernel", "kernel_record": {"max_usage": 123}}
    assert kernel_max_usage(RunResult(outcome="ok", memory_limit=kernel)) == 123
    assert kernel_max_usage(RunResult(outcome="ok", memory_limit={"enforced_by": "watchdog"})) is None
    assert kernel_max_usage(RunResult(outcome="ok")) is None


def _mem_run(rows, key="mem"):
    return RunResult(outcome="ok", values={key: {"reports": rows}})


def test_memory_reports_are_read_per_worker_in_mib():
    from labutils.kit import memory
    MiB = memory.MiB
    rows = [dict(worker=0, uss=10 * MiB, birth_uss=8 * MiB, pss=6 * MiB),
            dict(worker=1, uss=20 * MiB, birth_uss=8 * MiB, pss=9 * MiB),
            dict(worker=0, uss=30 * MiB, birth_uss=8 * MiB, pss=7 * MiB)]
    run = _mem_run(rows)
    assert [r["uss"] for r in memory.last_reports(run)] == [30 * MiB, 20 * MiB]
    assert memory.growth_per_worker(run) == (22 + 12) / 2
    assert memory.birth_uss(run) == 8
    assert memory.total_extra(run) == [2, 14, 34]
    assert memory.workers_pss(run) == 7 + 9
    # a script that emits its own list of reports
    own = RunResult(outcome="ok", values={"reports": rows})
    assert memory.workers_pss(own, key=None) == 16

