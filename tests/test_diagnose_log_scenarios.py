"""``diagnose --log`` on the lab's own logs: the stdout and stderr of every broken scenario (the session's own
``diagnose`` runs of them, shared with tests/test_scenarios.py), read back as a pasted log must name the
cause the run's diagnosis named, or the same cause with lower confidence and the missing evidence named;
never another cause with ``high``. Under ``--lab-matrix`` each start method's runs are read too."""

from __future__ import annotations

import pytest

from labutils.diagnosis.diagnose import explain
from labutils.runner.isolate import private_shm_support
from labutils.scenarios import SCENARIOS

RANK = {"low": 0, "medium": 1, "high": 2}
BROKEN = [c for c, sc in SCENARIOS.items() if sc.expected != "ok"]


def log_of(report: dict) -> str:
    """What a terminal showed for the run: its stdout, then its stderr (what a job's log holds)."""
    return (report.get("stdout") or "") + "\n" + (report.get("stderr") or "")


def agrees(run: dict, log) -> str:
    """'' when the log's diagnosis agrees with the run's, else why not."""
    if log.cause == run["cause"]:
        if RANK[log.confidence] > RANK[run["confidence"]]:
            return f"the log says {log.confidence}, more than the run's {run['confidence']}"
        if RANK[log.confidence] < RANK[run["confidence"]] and not (log.cannot_prove and log.decide_with):
            return "lower confidence than the run, without saying what is missing and how to decide it"
        return ""
    if log.confidence != "high" and run["cause"] in (log.cannot_prove or "") and log.decide_with:
        return ""  # the text cannot tell the two apart, says so, and names the command that can
    return f"the log names {log.cause} ({log.confidence}), the run {run['cause']} ({run['confidence']})"


@pytest.mark.parametrize("cause", BROKEN)
def test_the_log_of_each_broken_scenario_names_the_runs_cause(cause, lab_start_method, scenario_runs):
    sc = SCENARIOS[cause]
    if sc.broken_options.shm_size and private_shm_support()[0] is None:
        pytest.skip(f"{sc.id}: a private /dev/shm cannot be mounted here")
    run = scenario_runs.report(sc, "broken", lab_start_method)
    text = log_of(run)
    log = explain(text)
    assert log.source == "log"
    why = agrees(run, log)
    assert not why, f"{sc.broken}: {why}\n{log}\n--- log tail\n{text[-3000:]}"


#: the whole stderr of oom_killed_broken.py under forkserver (2026-12-06, this machine): the status check's
#: generic line, nothing about the kill; the run's own record (the cgroup's oom_kill) named oom_killed, high
FORKSERVER_OOM = """Traceback (most recent call last):
  File "/x/torch/utils/data/dataloader.py", line 1291, in _try_get_data
    data = self._data_queue.get(timeout=timeout)
  File "/usr/lib/python3.11/multiprocessing/queues.py", line 114, in get
    raise Empty
_queue.Empty

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/labutils/scenarios/oom_killed_broken.py", line 40, in <module>
    means = [batch.mean().item() for batch in loader]
  File "/x/torch/utils/data/dataloader.py", line 1304, in _try_get_data
    raise RuntimeError(
RuntimeError: DataLoader worker (pid(s) 13666) exited unexpectedly
"""


def test_a_generic_death_in_a_log_names_the_oom_killer_as_what_to_check_first():
    log = explain("epoch 0: 25 batches\n\n" + FORKSERVER_OOM)
    assert log.confidence != "high" and "oom_killed" in log.cannot_prove and "dmesg" in log.decide_with, log
    assert agrees({"cause": "oom_killed", "confidence": "high"}, log) == ""
    # a worker's own exit code in the text decides it: no memory question then
    coded = explain(FORKSERVER_OOM.replace("(pid(s) 13666) exited unexpectedly", "(pid 13666) exited unexpectedly "
                                           "with exit code 3. Details are lost due to multiprocessing."))
    assert "oom_killed" not in (coded.cannot_prove or ""), coded


#: the end of oom_killed_broken.py's stderr under forkserver in CI (2026-12-07): the worker was killed while
#: the main process fetched its batch's fd, before its exit status reached the loader; no PyTorch message at all
FORKSERVER_OOM_MID_HANDOVER = """Traceback (most recent call last):
  File "/x/labutils/scenarios/oom_killed_broken.py", line 40, in <module>
    means = [batch.mean().item() for batch in loader]
  File "/x/torch/utils/data/dataloader.py", line 1291, in _try_get_data
    data = self._data_queue.get(timeout=timeout)
  File "/usr/lib/python3.11/multiprocessing/queues.py", line 122, in get
    return _ForkingPickler.loads(res)
  File "/x/torch/multiprocessing/reductions.py", line 538, in rebuild_storage_fd
    fd = df.detach()
  File "/usr/lib/python3.11/multiprocessing/resource_sharer.py", line 57, in detach
    with _resource_sharer.get_connection(self._id) as conn:
  File "/usr/lib/python3.11/multiprocessing/resource_sharer.py", line 86, in get_connection
    c = Client(address, authkey=process.current_process().authkey)
  File "/usr/lib/python3.11/multiprocessing/connection.py", line 524, in Client
    answer_challenge(c, authkey)
  File "/usr/lib/python3.11/multiprocessing/connection.py", line 395, in _recv
    chunk = read(handle, remaining)
ConnectionResetError: [Errno 104] Connection reset by peer
"""


def test_a_death_seen_only_mid_handover_names_the_oom_killer_as_what_to_check_first():
    log = explain("epoch 0: 25 batches\n\n" + FORKSERVER_OOM_MID_HANDOVER)
    assert log.cause == "worker_exit" and log.confidence == "low", log
    assert "oom_killed" in log.cannot_prove and "dmesg" in log.decide_with, log
    assert agrees({"cause": "oom_killed", "confidence": "high"}, log) == ""
    # the same reset with nothing of the loader's fd passing in its frames is no worker's death
    plain = explain(FORKSERVER_OOM_MID_HANDOVER.split("  File \"/x/torch/utils")[0]
                    + "ConnectionResetError: [Errno 104] Connection reset by peer\n")
    assert "oom_killed" not in (plain.cannot_prove or ""), plain


def test_agreement_is_checked_both_ways():
    """The check itself can fail: another cause, or more confidence than the run had."""
    run = {"cause": "native_crash", "confidence": "medium"}
    text = "RuntimeError: DataLoader worker (pid 7) is killed by signal: Segmentation fault."
    assert agrees(run, explain(text)) == ""
    assert "names" in agrees({"cause": "fd_limit", "confidence": "high"}, explain(text))
    bus = explain("RuntimeError: DataLoader worker (pid 7) is killed by signal: Bus error.")
    assert agrees({"cause": "native_crash", "confidence": "medium"}, bus) == ""  # named as the alternative
    assert "names" in agrees({"cause": "fd_limit", "confidence": "medium"}, bus)
    loud = explain(text)
    loud.confidence = "high"
    assert "more than" in agrees(run, loud)
