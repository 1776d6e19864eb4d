"""labutils.kit.shmwatch: the /dev/shm meter, one measured loader pass, and notebook 05's choice of path
(a private tmpfs, the real small /dev/shm, or recorded results), with "unshare refused" forced."""

from __future__ import annotations

import os
import uuid

import pytest

from labutils.kit import shmwatch
from labutils.kit.shmwatch import LESSON_SAMPLE, MiB, in_flight_rule, plan, sample_for

HAS_SHM = os.path.isdir("/dev/shm")


def test_in_flight_rule():
    assert in_flight_rule(3 * MiB, num_workers=2, prefetch_factor=2) == 18 * MiB
    assert in_flight_rule(MiB, num_workers=1, prefetch_factor=1) == 3 * MiB


def test_peak_meter_keeps_the_highest_value(monkeypatch):
    values = iter([100, 100, 400, 250, 120] + [110] * 10000)
    monkeypatch.setattr(shmwatch, "shm_used", lambda path: next(values))
    with shmwatch.PeakMeter(interval=0.0) as meter:
        while meter.samples < 6:
            pass
    assert meter.baseline == 100
    assert meter.peak_total == 400 and meter.peak == 300


@pytest.mark.skipif(not HAS_SHM, reason="no /dev/shm on this platform")
def test_peak_meter_sees_a_real_file(no_leaks):
    path = f"/dev/shm/labutils-test-{uuid.uuid4().hex}"
    with shmwatch.PeakMeter() as meter:
        with open(path, "wb") as fh:
            fh.write(b"x" * (4 * MiB))
        try:
            while meter.samples < 20:
                pass
        finally:
            os.unlink(path)
    # the meter reads the whole /dev/shm: a neighbour's file removed meanwhile lowers it (seen once in a full
    # run: 4190208 bytes, one page short of the 4 MiB written), so the lower bound leaves 256 KiB for that
    assert 4 * MiB - 256 * 1024 <= meter.peak < 8 * MiB


@pytest.mark.skipif(not HAS_SHM, reason="no /dev/shm on this platform")
def test_try_config_one_pass(no_leaks):
    import torch

    class Values(torch.utils.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            return torch.full((64, 64), float(i))

    r = shmwatch.try_config(Values(), 3, 1, 2, read=lambda b: b[:, 0, 0].int().tolist(), step_s=0,
                            multiprocessing_context="fork")
    assert r["error"] is None and r["seen"] == list(range(12)) and r["batches"] == 4
    assert r["config"] == [3, 1, 2] and r["start_method"] == "fork" and r["peak"] >= 0


def test_try_config_keeps_the_loader_error(no_leaks):
    class Broken:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            raise RuntimeError("no such sample")

    r = shmwatch.try_config(Broken(), 2, 0, None, step_s=0)
    assert "no such sample" in r["error"] and r["batches"] == 0


def test_sample_for_keeps_the_lesson_numbers():
    assert sample_for(8 * MiB) == LESSON_SAMPLE
    for free in (8 * MiB, 63 * MiB, 64 * MiB, 200 * MiB):
        sample = sample_for(free)
        assert in_flight_rule(4 * sample, 2, 2) > 2 * free       # the broken batch fails by far
        assert in_flight_rule(1 * sample, 2, 2) <= 0.6 * free    # one image per batch fits with room
        assert sample % (3 * 256 * 4) == 0


def fake_shm(monkeypatch, total, free):
    monkeypatch.setattr(shmwatch, "shm_usage", lambda path: (total, free))


def test_plan_private_where_the_mount_is_allowed(monkeypatch):
    fake_shm(monkeypatch, 24 * 1024 * MiB, 24 * 1024 * MiB)
    p = plan((["unshare", "--mount"], None), env={})
    assert p.mode == "private" and p.runs
    assert p.isolate_args == "--shm-size 8M" and p.sample_bytes == LESSON_SAMPLE and p.image_width == 256


def test_plan_forced_off_with_a_small_real_shm_runs_there(monkeypatch):
    # Docker's default: no unshare (seccomp), 64 MiB /dev/shm of which a little is in use
    fake_shm(monkeypatch, 64 * MiB, 60 * MiB)
    p = plan((["unshare", "--mount"], None), env={shmwatch.ENV_PRIVATE: "off"})
    assert p.mode == "real" and p.runs and p.isolate_args == ""
    assert "LABUTILS_PRIVATE_SHM=off" in p.reason and "small" in p.reason
    assert p.free_bytes == 60 * MiB and p.sample_bytes == sample_for(60 * MiB)


def test_plan_refused_with_a_big_real_shm_shows_recorded_results(monkeypatch):
    fake_shm(monkeypatch, 24 * 1024 * MiB, 24 * 1024 * MiB)
    p = plan((None, "unshare: Operation not permitted"), env={})
    assert p.mode == "recorded" and not p.runs and not p.forced
    assert p.free_bytes == 8 * MiB and p.facts["measured_free"] == 24 * 1024 * MiB  # the recorded runs' size
    assert p.isolate_args == "--shm-size 8M"  # the runner, refused, reports every such run unsupported
    assert "Operation not permitted" in p.reason and "disturb" in p.reason
    assert "recorded" in str(p)
    assert len(shmwatch.RECORDED_8M) >= 4


def test_plan_forced_off_on_this_machine():
    # the notebook's own call, with the switch: never "private", whatever this machine allows
    p = plan(env={shmwatch.ENV_PRIVATE: "off"})
    assert p.mode in ("real", "recorded") and p.forced
    assert shmwatch.ENV_PRIVATE in p.reason


def test_refuse_private_mounts_makes_shm_runs_unsupported(monkeypatch):
    from labutils.runner import isolate

    monkeypatch.setattr(isolate, "_shm_support", None)  # restored after the test
    assert not shmwatch.refuse_private_mounts(plan((None, "refused"), env={}))
    p = plan(env={shmwatch.ENV_PRIVATE: "off"})
    assert shmwatch.refuse_private_mounts(p)
    r = isolate.run_isolated("print('never runs')", shm_size="8M", timeout=30)
    assert r.outcome == "unsupported" and shmwatch.ENV_PRIVATE in r.reason and r.stdout == ""


def test_plan_without_dev_shm(monkeypatch):
    monkeypatch.setattr(shmwatch, "shm_usage", lambda path: None)
    p = plan((None, "not Linux"), env={})
    assert p.mode == "recorded" and "not Linux" in p.reason


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_leaked_shm_tells_a_leak_from_a_live_file(tmp_path):
    import mmap

    before = shmwatch.shm_names(str(tmp_path))
    dead = tmp_path / "torch_999999999_1_0"         # no such pid: its creator is gone
    dead.write_bytes(b"x" * 4096)
    alive = tmp_path / f"torch_{os.getpid()}_1_0"   # this process is alive
    alive.write_bytes(b"x" * 4096)
    orphan_sem = tmp_path / "sem.mp-orphan"
    orphan_sem.write_bytes(b"x" * 32)
    used_sem = tmp_path / "sem.mp-used"
    used_sem.write_bytes(b"x" * 4096)
    other = tmp_path / "unrelated"
    other.write_bytes(b"x")
    with open(used_sem, "r+b") as fh, mmap.mmap(fh.fileno(), 4096):  # mapped by a live process
        assert shmwatch.leaked_shm(before, str(tmp_path), grace=0) == {"torch_999999999_1_0", "sem.mp-orphan"}
    assert shmwatch.leaked_shm(shmwatch.shm_names(str(tmp_path)), str(tmp_path)) == set()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_leaked_shm_waits_for_a_file_its_owner_is_still_unlinking(tmp_path):
    """An unused semaphore that goes within the grace (as a resource tracker unlinks one after its
    creator died) is no leak; one that stays unused for the whole grace is, and only after it."""
    import threading
    import time

    before = shmwatch.shm_names(str(tmp_path))
    going = tmp_path / "sem.mp-going"
    going.write_bytes(b"x" * 32)
    staying = tmp_path / "sem.mp-staying"
    timer = threading.Timer(0.3, going.unlink)
    timer.start()
    try:
        assert shmwatch.leaked_shm(before, str(tmp_path), grace=5.0) == set()
    finally:
        timer.join()
    staying.write_bytes(b"x" * 32)
    t0 = time.monotonic()
    assert shmwatch.leaked_shm(before, str(tmp_path), grace=0.5) == {"sem.mp-staying"}
    assert time.monotonic() - t0 >= 0.5  # named only once the grace had passed
    with pytest.raises(ValueError, match="grace"):
        shmwatch.leaked_shm(before, str(tmp_path), grace=-1)


def test_remove_files_of_deletes_only_the_files_of_these_live_processes(tmp_path):
    import os
    import time

    from labutils.kit.shmwatch import remove_files_of

    me = os.getpid()
    mine = tmp_path / f"torch_{me}_123_0"
    old = tmp_path / f"torch_{me}_999_1"  # same pid number, made before this process started
    other = tmp_path / "torch_1_555_0"  # another process's (pid 1 is alive, not given)
    sem = tmp_path / "sem.mp-abc"
    for f in (mine, old, other, sem):
        f.write_bytes(b"x")
    long_ago = time.time() - 10 * 365 * 86400
    os.utime(old, (long_ago, long_ago))
    assert remove_files_of([me, 999999999], path=str(tmp_path)) == [mine.name]
    assert not mine.exists() and old.exists() and other.exists() and sem.exists()


# ---------------------------------------------------------------- where there is no /dev/shm (macOS)
# Simulated: this Linux machine has a /dev/shm, so these tests point the meter at a folder that does not
# exist (or make os.statvfs fail), which is what a Mac shows the meter.

def test_meter_without_dev_shm_says_unsupported_instead_of_raising(tmp_path):
    missing = str(tmp_path / "no-such-shm")
    reason = shmwatch.why_unsupported(missing)
    assert reason and missing in reason and not shmwatch.supported(missing)
    with shmwatch.PeakMeter(missing, interval=0.0) as meter:
        pass
    assert meter.supported is False and meter.reason == reason
    assert meter.peak is None and meter.stop() is None
    assert not meter.is_alive() and meter.samples == 0  # no thread was started
    assert "unsupported" in str(meter) and missing in str(meter)


def test_meter_where_statvfs_fails(monkeypatch, tmp_path):
    def refused(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(shmwatch.os, "statvfs", refused)
    assert "Permission denied" in shmwatch.why_unsupported(str(tmp_path))
    assert shmwatch.PeakMeter(str(tmp_path)).supported is False


def test_try_config_without_dev_shm_still_runs_the_loader(tmp_path, no_leaks):
    r = shmwatch.try_config(list(range(6)), 2, 0, None, read=lambda b: b.tolist(), step_s=0,
                            path=str(tmp_path / "no-such-shm"))
    assert r["error"] is None and r["seen"] == list(range(6)) and r["peak"] is None


def test_a_real_dev_shm_is_supported():
    if not HAS_SHM:
        pytest.skip("no /dev/shm on this platform")
    assert shmwatch.supported() and shmwatch.why_unsupported() is None
    assert shmwatch.PeakMeter().supported


@pytest.mark.skipif(not os.environ.get("CI"), reason="only where CI is set: CI must run notebook 05 for real")
def test_ci_runs_the_shared_memory_lesson_for_real():
    # notebook 05 in "recorded" mode asserts only that the runner refused: CI must not land there
    p = plan()
    assert p.runs, f"notebook 05 would only show recorded results here: {p}"
