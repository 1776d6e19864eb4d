"""The process tree and per-process attribution, on records shaped as the runner writes them.

The launcher scenarios (tests/test_scenarios.py) reproduce each shape for real under fork, forkserver and
spawn; these tests pin the parts a real run cannot force: which pid the kernel's OOM kill is charged to
when the runner's guess names the wrong worker, a pool of several processes, and a child's traceback text
interleaved with other stderr.
"""

from labutils import explain
from labutils.runner.result import ExceptionInfo, ProcessInfo, RunResult

ITER = {"event": "iter", "num_workers": 2, "timeout": 0, "start_method": "fork"}
DIED = "DataLoader worker (pid(s) {}) exited unexpectedly"
KILLED = "DataLoader worker (pid {}) is killed by signal: Killed. "


def _oom_run(record, a_flag=False, b_flag=True):
    """Worker 101 was SIGKILLed by the kernel; worker 102 was stopped a moment later by the loader's
    shutdown (SIGTERM). The runner's record of who the kernel killed is ``record``."""
    workers = [ProcessInfo(101, "w0", "dataloader_worker", -9, killed_by_kernel_oom=a_flag),
               ProcessInfo(102, "w1", "dataloader_worker", -15, killed_by_kernel_oom=b_flag)]
    chain = [ExceptionInfo("RuntimeError", DIED.format(101)),
             ExceptionInfo("RuntimeError", KILLED.format(101), link="cause")]
    limit = {"enforced_by": "kernel", "limit": 800 * 2**20, "mechanism": "cgroup v2 memory.max",
             "kernel_record": record}
    return RunResult("failed", 1, workers=workers, exceptions=chain, loader_events=[ITER], memory_limit=limit)


def test_kernel_oom_goes_to_the_sigkilled_worker_not_the_runners_guess():
    # no readable kernel log: the runner charged the kill to the first process that died after the
    # counter rose, here the worker the loader then stopped with SIGTERM
    d = explain(_oom_run({"oom_kill": 1, "killed_pids": [102], "killed_pids_from": "monitor"}))
    assert d.cause == "oom_killed" and d.confidence == "high", d
    assert "worker pid 101: killed by SIGKILL (by: kernel_oom)" in d.evidence, d.evidence
    assert not any(e.startswith("worker pid 102") and "kernel_oom" in e for e in d.evidence), d.evidence
    assert d.process["pid"] == 101, d.process


def test_kernel_log_names_the_pid():
    rec = {"oom_kill": 1, "killed_pids": [101], "killed_pids_from": "dmesg"}
    d = explain(_oom_run(rec, a_flag=True, b_flag=False))
    assert d.cause == "oom_killed" and d.confidence == "high"
    assert "worker pid 101: killed by SIGKILL (by: kernel_oom, named in the kernel log)" in d.evidence
    assert any("the kernel log names this pid" in e for e in d.evidence), d.evidence


def test_a_sigkill_the_kernel_log_does_not_name_is_not_the_oom_kill():
    # the kernel log names another process of the run (say the main process's helper): worker 101's
    # SIGKILL has no memory evidence of its own
    rec = {"oom_kill": 1, "killed_pids": [999], "killed_pids_from": "dmesg"}
    d = explain(_oom_run(rec, b_flag=False))
    assert not any("101" in e and "kernel_oom" in e for e in d.evidence), d.evidence
    assert d.confidence != "high", d


_CHILD_TB = """Process trainer:
Traceback (most recent call last):
  File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap
    self.run()
  File "/home/u/launch.py", line 14, in train
    for batch in loader:
  File "/x/torch/utils/data/dataloader.py", line 1567, in _process_data
    data.reraise()
  File "/x/torch/_utils.py", line 794, in reraise
    raise exception
RuntimeError: Caught RuntimeError in DataLoader worker process 1.
Original Traceback (most recent call last):
  File "/x/torch/utils/data/_utils/worker.py", line 374, in _worker_loop
    data = fetcher.fetch(index)
  File "/home/u/launch.py", line 9, in __getitem__
    raise RuntimeError("record 13 is truncated")
RuntimeError: record 13 is truncated
"""


def test_a_launcher_that_exits_0_after_its_child_failed_is_not_ok():
    r = RunResult("ok", 0, workers=[ProcessInfo(201, "trainer", "process", 1)],
                  stderr="starting\n" + _CHILD_TB + "trainer finished with exit code 1\n")
    d = explain(r)
    assert d.cause == "worker_exception" and "record 13 is truncated" in d.summary, d
    assert d.process["pid"] == 201 and d.process["name"] == "trainer" and d.process["via"] == "stderr"
    assert "exited 0 anyway" in d.summary
    # its exit code lost: the child's traceback alone is not enough for high confidence
    r.workers[0].exitcode = None
    d = explain(r)
    assert d.cause == "worker_exception" and d.confidence == "medium", d


def test_a_pool_job_with_several_processes_names_the_candidates():
    remote = '\n"""\n' + _CHILD_TB.split("\n", 1)[1] + '"""'
    chain = [ExceptionInfo("RuntimeError", "Caught RuntimeError in DataLoader worker process 1."),
             ExceptionInfo("_RemoteTraceback", remote, link="cause")]
    r = RunResult("failed", 1, exceptions=chain, workers=[ProcessInfo(301, "ForkProcess-1", "process", 0),
                                                           ProcessInfo(302, "ForkProcess-2", "process", 0)])
    d = explain(r)
    assert d.cause == "worker_exception", d
    assert d.process["pid"] is None and d.process["candidates"] == [301, 302], d.process
    assert "one of pids 301, 302" in d.summary


def test_a_child_error_nothing_explains_keeps_confidence_below_high():
    # the main process failed outside the loader; a child's DataLoader failed too: the answer is the
    # main process's, and the child's text is listed as unexplained
    main = [ExceptionInfo("ValueError", "shapes (4,3) and (5,) not aligned",
                          traceback='Traceback (most recent call last):\n  File "/home/u/launch.py", line 30, in '
                                    '<module>\n    model(x)\nValueError: shapes (4,3) and (5,) not aligned\n')]
    r = RunResult("failed", 1, exceptions=main, workers=[ProcessInfo(201, "trainer", "process", 1)],
                  stderr=_CHILD_TB)
    d = explain(r)
    assert d.cause == "outside_loader", d
    assert any("Caught RuntimeError in DataLoader worker process 1" in t for t in d.unexplained), d.unexplained
    assert d.confidence != "high"


#: One spawn worker's traceback as Python 3.13 printed it in a run started from a Jupyter kernel (ipykernel
#: sets FORCE_COLOR=1, so the child colours it): copied from a real run of notebook 08's trap under 3.13.
COLOURED_313 = "\n".join([
    'Traceback (most recent call last):',
    '  File \x1b[35m"<string>"\x1b[0m, line \x1b[35m1\x1b[0m, in \x1b[35m<module>\x1b[0m',
    '    from multiprocessing.spawn import spawn_main; \x1b[31mspawn_main\x1b[0m\x1b[1;31m(tracker_fd=7, pipe_handle=15)\x1b[0m',  # noqa: E501
    '                                                  \x1b[31m~~~~~~~~~~\x1b[0m\x1b[1;31m^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\x1b[0m',  # noqa: E501
    '  File \x1b[35m"/root/.pyenv/versions/3.13.0/lib/python3.13/multiprocessing/spawn.py"\x1b[0m, line \x1b[35m122\x1b[0m, in \x1b[35mspawn_main\x1b[0m',  # noqa: E501
    '    exitcode = _main(fd, parent_sentinel)',
    '  File \x1b[35m"/root/.pyenv/versions/3.13.0/lib/python3.13/multiprocessing/spawn.py"\x1b[0m, line \x1b[35m132\x1b[0m, in \x1b[35m_main\x1b[0m',  # noqa: E501
    '    self = reduction.pickle.load(from_parent)',
    "\x1b[1;35mAttributeError\x1b[0m: \x1b[35mCan't get attribute 'Thumbnails' on <module '__main__' (<class '_frozen_importlib.BuiltinImporter'>)>\x1b[0m",  # noqa: E501
])


def test_a_coloured_traceback_of_python_3_13_is_read_like_a_plain_one():
    chain = [ExceptionInfo("RuntimeError", DIED.format("1539, 1540")),
             ExceptionInfo("RuntimeError", "DataLoader worker (pid 1540) exited unexpectedly with exit code 1. "
                           "Details are lost due to multiprocessing.", link="cause")]
    it = dict(ITER, start_method="spawn", dataset="__main__.Thumbnails")
    r = RunResult("failed", 1, exceptions=chain, loader_events=[it], stderr=COLOURED_313 + "\n",
                  workers=[ProcessInfo(1539, "Process-1", "dataloader_worker", 1),
                           ProcessInfo(1540, "Process-2", "dataloader_worker", 1)])
    d = explain(r)
    assert d.cause == "main_not_importable" and d.confidence == "high", d  # was worker_exit (high) on 3.13
