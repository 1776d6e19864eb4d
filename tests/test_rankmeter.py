"""labutils.kit.rankmeter: the /dev/shm of this runner's lab runs, by identity, whatever else is in /dev/shm."""

import mmap
import os
import subprocess
import sys
import textwrap

import pytest

import labutils
from labutils.kit.rankmeter import RunShmMeter
from labutils.kit.shmfiles import held_shm
from labutils.runner.procs import start_ticks

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd") or not os.path.isdir("/dev/shm"),
                                reason="no /proc or /dev/shm (macOS): the meter reports itself unsupported")
MiB = 2**20

# a lab run that holds two 6 MiB /dev/shm files for 1.5 s, unlinked at once as PyTorch does: one mapped by
# a child process, one only open in the run's main process (a batch on its way between two processes)
HOLDER = textwrap.dedent("""
    import mmap, multiprocessing as mp, os, time
    def child(ready):
        fd = os.open("/dev/shm/lab-test-rankmeter-mapped-%d" % os.getpid(), os.O_CREAT | os.O_RDWR, 0o600)
        os.unlink("/dev/shm/lab-test-rankmeter-mapped-%d" % os.getpid())
        os.ftruncate(fd, 6 << 20)
        m = mmap.mmap(fd, 6 << 20)
        os.close(fd)
        m[:] = b"x" * (6 << 20)
        ready.set()
        time.sleep(1.5)
    if __name__ == "__main__":
        name = "/dev/shm/lab-test-rankmeter-open-%d" % os.getpid()
        fd = os.open(name, os.O_CREAT | os.O_RDWR, 0o600)
        os.unlink(name)
        os.write(fd, b"y" * (6 << 20))
        ready = mp.get_context("fork").Event()
        p = mp.get_context("fork").Process(target=child, args=(ready,))
        p.start()
        ready.wait(10)
        p.join()
        os.close(fd)
        import labutils
        labutils.emit(child=p.pid)
""")

# another program's 16 MiB file, made while the meter runs (a whole-/dev/shm meter would count it); the
# program carries another live runner's mark (pid 1's, as a second kernel's run would carry its kernel's)
BYSTANDER = textwrap.dedent("""
    import mmap, os, sys, time
    sys.stdin.readline()
    fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 16 << 20)
    m = mmap.mmap(fd, 16 << 20)
    m[:] = b"z" * (16 << 20)
    print("ready", flush=True)
    sys.stdin.read()
""")


def test_counts_the_runs_files_once_and_no_one_elses():
    path = f"/dev/shm/lab-test-rankmeter-bystander-{os.getpid()}"
    bystander = subprocess.Popen([sys.executable, "-c", BYSTANDER, path], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "LABUTILS_RUNNER": f"1.{start_ticks(1)}"})
    try:
        with RunShmMeter() as meter:
            bystander.stdin.write("go\n")
            bystander.stdin.flush()
            assert bystander.stdout.readline().strip() == "ready"
            result = labutils.run_isolated(HOLDER, timeout=60)
        assert result.ok, result.diagnosis
        assert held_shm([bystander.pid]) == 16 * MiB  # the meter's reader sees the bystander's file...
    finally:
        bystander.communicate("")
        os.unlink(path)
    # ...and the meter counts the run's two files (one mapped by the child, one open in the run's main
    # process), not the bystander's; the Event's semaphores are /dev/shm files too, a page each
    assert 12 * MiB <= meter.peak <= 12 * MiB + 16 * 4096, meter.peak
    assert meter.samples > 10 and result.values["child"] in {pid for pid, _ticks in meter.runs_seen}
    assert bystander.pid not in {pid for pid, _ticks in meter.runs_seen}
    assert meter.peak == meter.peak_total and "processes" in str(meter)


def test_a_file_shared_by_two_processes_counts_once():
    name = f"/dev/shm/lab-test-rankmeter-shared-{os.getpid()}"
    base = held_shm([os.getpid()])  # what this test process maps already (an earlier test's semaphores, say)
    fd = os.open(name, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4 * MiB)
        m = mmap.mmap(fd, 4 * MiB)  # mapped here and open here: one file, one count
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                                 pass_fds=(fd,))
        try:
            assert held_shm([child.pid]) == 4 * MiB  # held open only, by an inherited fd
            assert held_shm([os.getpid(), child.pid]) == base + 4 * MiB
        finally:
            child.communicate(b"")
        m.close()
    finally:
        os.close(fd)
        os.unlink(name)


def test_a_gone_process_is_skipped():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert held_shm([child.pid]) == 0
