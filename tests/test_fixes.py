"""labutils.kit.fixes with real DataLoaders: 2 fork workers (one spawn test for picklability), small datasets."""

from __future__ import annotations

import functools
import json
import os
import pickle
import random
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from labutils.diagnosis.pickling import find_unpicklable
from labutils.kit.fixes import (
    LazyFile,
    PerWorkerResource,
    QuarantineDataset,
    QuarantinedBatch,
    QuarantineReport,
    ResilientLoader,
    Skipped,
    WorkerInit,
    collate_skip,
    is_worker_death,
    make_worker_init,
    pet_watchdog,
    worker_init_seed_and_faulthandler,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_FORK = "fork" in __import__("multiprocessing").get_all_start_methods()
needs_fork = pytest.mark.skipif(not HAS_FORK, reason="needs the fork start method")


def items(loader):
    return [x for batch in loader for x in batch.tolist()]


# ---------------------------------------------------------------------------------- lazy handles


class LinesDataset(Dataset):
    """Line i of a text file, read through a LazyFile with seek: shared offsets would scramble it."""

    def __init__(self, path, n):
        self.fh = LazyFile(path, "rb")
        self.offsets = []
        with open(path, "rb") as f:
            for _ in range(n):
                self.offsets.append(f.tell())
                f.readline()

    def __len__(self):
        return len(self.offsets)

    def __getitem__(self, i):
        self.fh.seek(self.offsets[i])
        line = self.fh.readline().decode().strip()
        return {"line": line, "pid": os.getpid(), "opened_pid": self.fh.opened_pid}


def _write_lines(path, n):
    path.write_text("".join(f"line {i:04d}\n" for i in range(n)))


def test_lazy_file_pickles_as_path_and_mode(tmp_path):
    path = tmp_path / "a.txt"
    _write_lines(path, 3)
    fh = LazyFile(path, "rb")
    assert fh.opened_pid is None
    assert fh.readline() == b"line 0000\n"  # attribute access opens it
    assert fh.opened_pid == os.getpid()
    copy = pickle.loads(pickle.dumps(fh))
    assert copy.opened_pid is None and copy.path == str(path) and copy.mode == "rb"
    assert list(copy) == [b"line 0000\n", b"line 0001\n", b"line 0002\n"]
    assert find_unpicklable(fh, "fh") == []
    fh.close()
    copy.close()
    with pytest.raises(ValueError, match="for reading"):
        LazyFile(path, "w")


@needs_fork
def test_lazy_file_reopens_in_forked_workers(tmp_path, no_leaks):
    path = tmp_path / "lines.txt"
    _write_lines(path, 16)
    ds = LinesDataset(path, 16)
    assert ds[0]["opened_pid"] == os.getpid()  # opened in the parent before the fork
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    out = [row for batch in loader for row in zip(batch["line"], batch["pid"].tolist(),
                                                  batch["opened_pid"].tolist())]
    assert [line for line, _, _ in out] == [f"line {i:04d}" for i in range(16)]
    assert all(pid == opened for _, pid, opened in out)  # each worker uses its own handle
    assert len({pid for _, pid, _ in out}) == 2 and os.getpid() not in {pid for _, pid, _ in out}
    ds.fh.close()


def _connect(db):
    return sqlite3.connect(db)


class SqlDataset(Dataset):
    def __init__(self, db, n):
        self.db = PerWorkerResource(functools.partial(_connect, db))
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        (value,) = self.db.get().execute("SELECT v FROM t WHERE k = ?", (i,)).fetchone()
        return torch.tensor([value, os.getpid(), self.db.opened_pid])


@needs_fork
def test_per_worker_resource_with_sqlite(tmp_path, no_leaks):
    db = str(tmp_path / "d.db")
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (k INTEGER, v INTEGER)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, i * 10) for i in range(12)])
    conn.close()
    ds = SqlDataset(db, 12)
    assert ds[1][0].item() == 10  # the parent opens one too
    assert find_unpicklable(ds, "dataset") == []  # the open connection is not pickled
    rows = torch.cat(list(DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context="fork")))
    assert rows[:, 0].tolist() == [i * 10 for i in range(12)]
    assert (rows[:, 1] == rows[:, 2]).all()  # built in the worker that uses it
    ds.db.close()


def test_per_worker_resource_pickles_only_the_factory():
    res = PerWorkerResource(functools.partial(_connect, ":memory:"))
    conn = res.get()
    assert res.get() is conn and res() is conn
    clone = pickle.loads(pickle.dumps(res))
    assert clone.opened_pid is None and clone.get() is not conn
    res.close()
    clone.close()
    [blocker] = find_unpicklable(PerWorkerResource(lambda: 1), "res")  # a lambda factory would not pickle
    assert blocker.path == "res.factory"
    with pytest.raises(TypeError):
        PerWorkerResource(42)


SPAWN_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    from torch.utils.data import DataLoader, Dataset
    from labutils.kit.fixes import LazyFile, make_worker_init
    from labutils.diagnosis.pickling import find_unpicklable

    class SpawnDataset(Dataset):
        def __init__(self, path):
            self.fh = LazyFile(path, "rb")
        def __len__(self):
            return 4
        def __getitem__(self, i):
            self.fh.seek(10 * i)
            return torch.tensor([int(self.fh.read(9)[-4:]), os.getpid(), self.fh.opened_pid])

    if __name__ == "__main__":
        ds = SpawnDataset(sys.argv[1])
        ds[0]  # opened here: the pickled copy must carry only the path
        init = make_worker_init(dump_after=600)
        blockers = [str(b) for b in find_unpicklable(ds, "dataset") + find_unpicklable(init, "init")]
        loader = DataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context="spawn",
                            worker_init_fn=init)  # one spawn worker shows it (each start imports torch)
        rows = torch.cat(list(loader)).tolist()
        print(json.dumps({"blockers": blockers, "rows": rows, "main": os.getpid()}))
""")


def test_spawn_workers_receive_lazy_handle_and_init_callable(tmp_path):
    # In a fresh interpreter: spawn starts multiprocessing's resource tracker, which would outlive the test.
    path = tmp_path / "lines.txt"
    _write_lines(path, 4)
    script = tmp_path / "spawn_run.py"
    script.write_text(SPAWN_SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["blockers"] == []
    rows = result["rows"]
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    assert all(pid == opened for _, pid, opened in rows)  # each spawn worker opened its own handle
    assert result["main"] not in {pid for _, pid, _ in rows}


# ------------------------------------------------------------------------------------ quarantine


class Flaky(Dataset):
    """Raises ValueError at 3 and 7, OSError at 5, KeyError at 9."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i in (3, 7):
            raise ValueError(f"corrupt sample {i}")
        if i == 5:
            raise OSError("truncated file")
        if i == 9:
            raise KeyError("missing label")
        return torch.tensor([i])


def path_of(i):
    return f"/data/img_{i:03d}.png"


@needs_fork
def test_quarantine_with_workers_records_and_drops(no_leaks):
    ds = QuarantineDataset(Flaky(), path_of=path_of)
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork", collate_fn=collate_skip)
    report = QuarantineReport()
    seen = []
    for batch in loader:
        assert isinstance(batch, QuarantinedBatch)
        data = report.add(batch)
        if data is not None:
            seen += data.view(-1).tolist()
    assert seen == [0, 1, 2, 4, 6, 8, 10, 11]
    assert report.count == 4 and sorted(report.indices) == [3, 5, 7, 9]
    assert report.by_kind == {"ValueError": 2, "OSError": 1, "KeyError": 1}
    assert ds.skipped == []  # the markers were made in the workers, not here
    text = str(report)
    assert text.startswith("4 samples skipped in 3 batches")
    assert "index 5  /data/img_005.png  OSError: truncated file" in text
    assert all(r.worker_id in (0, 1) for r in report.records)


def test_quarantine_only_catches_what_it_is_told(no_leaks):
    ds = QuarantineDataset(Flaky(), catch=(ValueError, OSError))
    assert isinstance(ds[3], Skipped) and ds[3].worker_id is None
    with pytest.raises(KeyError):
        ds[9]
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_skip)
    it = iter(loader)
    with pytest.raises(KeyError, match="Caught KeyError in DataLoader worker process"):
        list(it)
    it._shutdown_workers()  # the traceback keeps the iterator (and its workers) alive otherwise
    assert len(ds.skipped) == 2  # the two direct calls above, in this process


def test_all_skipped_batch_and_custom_collate():
    bad = [Skipped(i, "ValueError", "x") for i in range(3)]
    empty = collate_skip(bad)
    assert empty == QuarantinedBatch(None, bad)
    report = QuarantineReport()
    assert report.add(empty) is None and report.count == 3 and report.empty_batches == 1
    data, skipped = collate_skip([torch.tensor([1]), bad[0], torch.tensor([2])])
    assert data.tolist() == [[1], [2]] and skipped == [bad[0]]
    as_list = functools.partial(collate_skip, collate_fn=list)
    assert as_list([1, bad[1], 2]) == QuarantinedBatch([1, 2], [bad[1]])
    assert report.add(torch.tensor([5])).tolist() == [5]  # plain batches pass through
    assert "no samples skipped" in str(QuarantineReport())


def test_quarantine_keeps_index_error_for_plain_iteration():
    ds = QuarantineDataset(Flaky(), path_of=path_of)
    got = list(ds)  # old-style iteration stops at IndexError
    assert len(got) == 12 and sum(isinstance(x, Skipped) for x in got) == 4
    assert ds.skipped[0].path == "/data/img_003.png"


# ---------------------------------------------------------------------------------- worker init


class SeedProbe(Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        seed = torch.initial_seed() % 2**32
        return torch.tensor([random.random(), random.Random(seed).random(),
                             np.random.rand(), np.random.RandomState(seed).rand()], dtype=torch.float64)


@needs_fork
def test_worker_init_seeds_random_and_numpy_from_torch_seed(no_leaks):
    loader = DataLoader(SeedProbe(), batch_size=None, num_workers=2, multiprocessing_context="fork",
                        worker_init_fn=worker_init_seed_and_faulthandler)
    rows = list(loader)  # item i is the first item of worker i
    for got_random, want_random, got_np, want_np in (r.tolist() for r in rows):
        assert got_random == want_random and got_np == want_np
    assert rows[0][0] != rows[1][0]  # different per worker


def test_worker_init_is_picklable_and_validates():
    init = make_worker_init(dump_after=2.5)
    assert isinstance(init, WorkerInit)
    clone = pickle.loads(pickle.dumps(init))
    assert clone.dump_after == 2.5
    with pytest.raises(ValueError):
        make_worker_init(dump_after=0)
    pet_watchdog()  # no watchdog armed in this process: a no-op


class Sleepy(Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        if i == 1:
            time.sleep(1.0)  # "stuck": twice the watchdog's interval
        return i


@needs_fork
def test_watchdog_dumps_the_stuck_workers_stack(capfd, no_leaks):
    loader = DataLoader(Sleepy(), batch_size=None, num_workers=2, multiprocessing_context="fork",
                        worker_init_fn=make_worker_init(dump_after=0.5))
    assert list(loader) == [0, 1]
    err = capfd.readouterr().err
    assert "Timeout (0:00:00.500000)!" in err
    assert "in __getitem__" in err and "test_fixes.py" in err


CRASH_SCRIPT = textwrap.dedent("""
    import ctypes, sys
    import torch
    from torch.utils.data import DataLoader, Dataset
    from labutils.kit.fixes import is_worker_death, worker_init_seed_and_faulthandler

    class Crashes(Dataset):
        def __len__(self):
            return 4
        def __getitem__(self, i):
            if i == 2:
                ctypes.string_at(0)  # SIGSEGV
            return i

    for label, init in (("PLAIN", None), ("WITH_INIT", worker_init_seed_and_faulthandler)):
        print(f"=== {label}", file=sys.stderr, flush=True)
        try:
            list(DataLoader(Crashes(), batch_size=None, num_workers=2, multiprocessing_context="fork",
                            worker_init_fn=init))
        except RuntimeError as exc:
            print(f"{label} death={is_worker_death(exc)}", flush=True)
""")


@needs_fork
def test_faulthandler_prints_the_python_stack_of_a_segfaulting_worker(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    env["PYTHONPATH"] = REPO
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "PLAIN death=True" in out.stdout and "WITH_INIT death=True" in out.stdout
    plain, with_init = out.stderr.split("=== WITH_INIT")
    assert "Fatal Python error: Segmentation fault" not in plain
    assert "Fatal Python error: Segmentation fault" in with_init
    assert re.search(r'crash.py", line \d+ in __getitem__', with_init)
    assert "Unexpected segmentation fault encountered in worker" in with_init  # torch's handler still ran


# ------------------------------------------------------------------------------ resilient loader


class KillsItself(Dataset):
    """SIGKILLs its worker at ``kill_at``: once (a marker file claims it) or every time; never in the main
    process."""

    def __init__(self, n, kill_at, marker=None):
        self.n, self.kill_at, self.marker = n, kill_at, marker
        self.calls_in_main = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.kill_at and get_worker_info() is not None:
            if self.marker is None:
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        if get_worker_info() is None:
            self.calls_in_main += 1
        return i


@needs_fork
def test_resilient_loader_recovers_from_a_killed_worker(tmp_path, no_leaks):
    ds = KillsItself(12, kill_at=5, marker=str(tmp_path / "killed"))
    events = []
    loader = ResilientLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork",
                             on_restart=events.append)
    assert len(loader) == 6
    got = items(loader)
    assert got == list(range(12))  # every index exactly once, in order
    assert loader.restarts == 1 and events == loader.events
    assert events[0].batch_index <= 2 and events[0].num_workers == 2  # resumed at or before batch [4, 5]
    # PyTorch's report, its status check's, or (a worker killed mid hand-over of a batch's fd) the reset echo
    assert any(words in events[0].error for words in ("killed by signal", "exited unexpectedly", "reset by peer"))
    assert os.path.exists(tmp_path / "killed")


@needs_fork
def test_a_death_is_judged_once_pytorch_no_longer_watches_the_dead_worker(tmp_path, monkeypatch, no_leaks):
    # seen in the matrix under load: the loop met the dead worker's reset hand-over, and PyTorch's SIGCHLD
    # handler raised "killed by signal" while that error was judged, out of the loader. The handler raises only
    # for workers still registered (`_worker_pids_set`): the judging must come after the shut-down that
    # unregisters them.
    from torch.utils.data import DataLoader

    from labutils.kit import fixes

    iterators, judge, registered = [], fixes.is_worker_death, []
    make = DataLoader._get_iterator

    def recorded(self):
        iterators.append(make(self))
        return iterators[-1]

    def judging(exc):
        registered.append([it._worker_pids_set for it in iterators])
        return judge(exc)

    monkeypatch.setattr(DataLoader, "_get_iterator", recorded)
    monkeypatch.setattr(fixes, "is_worker_death", judging)
    loader = ResilientLoader(KillsItself(12, kill_at=9, marker=str(tmp_path / "killed")), batch_size=2,
                             num_workers=2, multiprocessing_context="fork", on_restart=lambda event: None)
    assert items(loader) == list(range(12)) and loader.restarts == 1
    assert registered and registered[0][0] is False, registered  # the first loader was unregistered first


@needs_fork
def test_resilient_loader_shuffled_epoch_falls_back_to_main_process(no_leaks):
    ds = KillsItself(10, kill_at=3)  # kills every worker that loads index 3
    loader = ResilientLoader(ds, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(0),
                             num_workers=2, multiprocessing_context="fork", fallback_num_workers=0)
    got = items(loader)
    assert sorted(got) == list(range(10)) and got != list(range(10))
    assert loader.restarts == 1 and loader.events[0].num_workers == 0 and ds.calls_in_main > 0


@needs_fork
def test_resilient_loader_gives_up_after_max_restarts(no_leaks):
    loader = ResilientLoader(KillsItself(8, kill_at=2), batch_size=2, num_workers=2,
                             multiprocessing_context="fork", max_restarts=1, on_restart=lambda e: None)
    with pytest.raises(RuntimeError) as info:
        items(loader)
    assert is_worker_death(info.value) and loader.restarts == 1


@needs_fork
def test_resilient_loader_does_not_swallow_getitem_exceptions(no_leaks):
    loader = ResilientLoader(Flaky(), batch_size=4, num_workers=2, multiprocessing_context="fork")
    with pytest.raises(ValueError, match="Caught ValueError in DataLoader worker process"):
        items(loader)
    assert loader.restarts == 0


def test_resilient_loader_refuses_what_it_cannot_resume():
    with pytest.raises(ValueError, match="in_order"):
        ResilientLoader(Flaky(), batch_size=2, in_order=False)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(TypeError, match="map-style"):
        ResilientLoader(Stream())


def test_is_worker_death_matches_stable_parts_only():
    outer = RuntimeError("DataLoader worker (pid(s) 123, 124) exited unexpectedly")
    outer.__cause__ = RuntimeError("DataLoader worker (pid 123) is killed by signal: Killed. ")
    assert is_worker_death(outer)
    assert is_worker_death(RuntimeError("DataLoader worker (pid 9) exited unexpectedly with exit code 1."))
    assert not is_worker_death(ValueError("Caught ValueError in DataLoader worker process 0."))
    assert not is_worker_death(RuntimeError(
        "Caught RuntimeError in DataLoader worker process 1.\\nRuntimeError: DataLoader worker (pid 5) "
        "exited unexpectedly"))
    assert not is_worker_death(RuntimeError("Pin memory thread exited unexpectedly"))
    assert not is_worker_death(OSError("No such file or directory"))
