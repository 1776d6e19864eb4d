"""labutils.kit.deaths: every shape of a reported worker death, on hand-built chains and on real runs."""

import pytest

from labutils import run_isolated
from labutils.kit import deaths
from labutils.runner.result import ExceptionInfo, ProcessInfo, RunResult

GEN = "DataLoader worker (pid(s) 4242) exited unexpectedly"
KILL = "DataLoader worker (pid 4242) is killed by signal: Killed. "


def _run(chain, method="fork", exitcode=-9, pid=4242):
    return RunResult(outcome="failed", exceptions=[ExceptionInfo(t, m) for t, m in chain],
                     workers=[ProcessInfo(pid=pid, role="dataloader_worker", exitcode=exitcode),
                              ProcessInfo(pid=pid + 1, role="dataloader_worker", exitcode=0)],
                     loader_events=[{"event": "iter", "num_workers": 2, "start_method": method}])


@pytest.mark.parametrize("chain, shape", [
    ([("RuntimeError", KILL)], "handler"),
    ([("RuntimeError", GEN), ("RuntimeError", KILL)], "handler_inside"),
    ([("RuntimeError", GEN), ("Empty", "")], "status_check"),
    ([("RuntimeError", GEN), ("ConnectionResetError", "[Errno 104] Connection reset by peer")], "status_check"),
])
def test_shapes_under_fork(chain, shape):
    run = _run(chain)
    assert deaths.classify(run).shape == shape
    death = deaths.check_death(run, signal=9)
    assert death.pids == (4242,)


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_bare_socket_error_is_a_death_when_a_worker_died(method):
    chain = [("ConnectionResetError", "[Errno 104] Connection reset by peer")]
    assert deaths.check_death(_run(chain, method), signal=9).shape == "socket"
    with pytest.raises(AssertionError, match="no worker died"):  # no worker died: the error is the user's own
        deaths.check_death(_run(chain, method, exitcode=0), signal=9)


def test_the_handler_never_speaks_under_forkserver():
    with pytest.raises(AssertionError, match="not possible under forkserver"):
        deaths.check_death(_run([("RuntimeError", KILL)], "forkserver"), signal=9)


def test_a_named_pid_must_be_a_worker_that_died_so():
    other = "DataLoader worker (pid(s) 4243) exited unexpectedly"  # the healthy worker's pid
    with pytest.raises(AssertionError, match="workers that died so"):
        deaths.check_death(_run([("RuntimeError", other)]), signal=9)
    stranger = "DataLoader worker (pid(s) 99) exited unexpectedly"
    with pytest.raises(AssertionError, match="the run's workers are"):
        deaths.check_death(_run([("RuntimeError", stranger)]), signal=9)


def test_the_signal_must_match_the_exit_status_and_the_word():
    with pytest.raises(AssertionError, match="no worker died"):
        deaths.check_death(_run([("RuntimeError", KILL)], exitcode=-11), signal=9)
    segv = "DataLoader worker (pid 4242) is killed by signal: Segmentation fault. "
    with pytest.raises(AssertionError, match="handler said"):
        deaths.check_death(_run([("RuntimeError", segv)]), signal=9)


def test_an_exception_raised_in_a_worker_is_no_death():
    run = _run([("ValueError", "Caught ValueError in DataLoader worker process 0.\nOriginal Traceback...")],
               exitcode=0)
    assert deaths.classify(run) is None
    with pytest.raises(AssertionError, match="no worker death"):
        deaths.check_death(run)


KILLER = '''
import os, signal, torch
from torch.utils.data import DataLoader, Dataset
class D(Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        if i == 5: os.kill(os.getpid(), signal.SIG)
        return torch.tensor(i)
if __name__ == "__main__":
    for _ in DataLoader(D(), num_workers=2, batch_size=2): pass
'''


@pytest.mark.parametrize("sig, num", [("SIGKILL", 9), ("SIGSEGV", 11)])
def test_a_real_death_is_checked(sig, num):
    run = run_isolated(KILLER.replace("signal.SIG)", f"signal.{sig})"), timeout=120)
    death = deaths.check_death(run, signal=num)
    assert death.shape in deaths.SHAPES
    with pytest.raises(AssertionError):
        deaths.check_death(run, signal=15)
