"""Evidence the diagnosis and the live lab read: init errors, progress, stalls with every stack, a live feed."""

from __future__ import annotations

import multiprocessing
import textwrap
import time

from labutils import run_isolated

LOADER = textwrap.dedent("""
    import os, signal, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class D(Dataset):
        def __len__(self):
            return {n}
        def __getitem__(self, i):
            {body}
            return torch.tensor(i)

    if __name__ == "__main__":
        for batch in DataLoader(D(), batch_size=2, num_workers=2):
            pass
""")


def loader(n=40, body="time.sleep(0.02)"):
    return LOADER.format(n=n, body=body)


def test_init_error_is_recorded_even_when_the_script_catches_it():
    code = textwrap.dedent("""
        import threading
        import torch
        from torch.utils.data import DataLoader, Dataset

        class D(Dataset):
            def __init__(self):
                self.lock = threading.Lock()
            def __len__(self):
                return 4
            def __getitem__(self, i):
                return i

        if __name__ == "__main__":
            try:
                iter(DataLoader(D(), num_workers=1, multiprocessing_context="spawn"))
            except Exception as exc:
                print("caught", type(exc).__name__)
    """)
    r = run_isolated(code, timeout=90)
    assert r.ok and "caught" in r.stdout, r.stderr
    inits = [ev for ev in r.loader_events if ev["event"] == "init_error"]
    assert len(inits) == 1 and isinstance(inits[0]["t"], float)
    chain = inits[0]["chain"]
    assert chain[0]["type"] == "TypeError" and "pickle" in chain[0]["message"]
    assert {"type", "module", "message", "link", "traceback"} <= set(chain[0])


def test_progress_counts_batches_and_ends_with_the_total():
    r = run_isolated(loader(n=40), timeout=90)
    assert r.ok, r.stderr
    progress = [ev for ev in r.loader_events if ev["event"] == "progress"]
    assert progress, r.loader_events
    counts = [ev["batches"] for ev in progress]
    assert counts == sorted(counts) and counts[-1] == 20  # 40 samples, batch_size 2: the final record
    assert {ev["iter"] for ev in progress} == {1}
    times = [ev["t"] for ev in progress]
    gaps = [b - a for a, b in zip(times, times[1:-1])]  # the last one comes at once, by design
    assert all(g >= 0.2 for g in gaps), gaps  # at most about four a second


def test_stall_stops_a_stuck_loader_with_every_stack(lab_start_method):
    # this machine's default start method; `pytest --lab-matrix` adds forkserver and spawn
    method = lab_start_method or multiprocessing.get_all_start_methods()[0]
    body = "if i == 9:\n            time.sleep(600)\n        time.sleep(0.01)"
    code = loader(n=40, body=body).replace("num_workers=2)", f"num_workers=2, multiprocessing_context='{method}')")
    stall = 3 if method == "fork" else 20  # a fresh torch import per worker before the first batch, on 2 busy cores
    t0 = time.monotonic()
    r = run_isolated(code, timeout=120, stall=stall)
    assert time.monotonic() - t0 < 100
    assert r.outcome == "timed_out" and r.stall is not None, r.reason
    assert r.stall["limit"] == stall and r.stall["idle_s"] >= stall
    assert 1 <= r.stall["batches"] <= 20
    workers = {w.pid for w in r.dataloader_workers}
    assert len(workers) == 2
    assert workers <= set(r.stacks), (workers, list(r.stacks))
    stuck = [pid for pid in workers if "__getitem__" in r.stacks[pid]]
    assert stuck, "the worker stuck in __getitem__ shows it in its stack"
    main = [pid for pid in r.stacks if pid not in workers]
    assert main and "most recent call first" in r.stacks[main[0]]
    assert "stall" in r.reason


def test_plain_timeout_takes_the_stacks_too():
    body = "time.sleep(600)"
    r = run_isolated(loader(n=8, body=body), timeout=6)
    assert r.outcome == "timed_out" and r.stall is None
    workers = {w.pid for w in r.dataloader_workers}
    assert workers and workers <= set(r.stacks)


def test_no_stall_for_a_slow_but_moving_loader():
    r = run_isolated(loader(n=30, body="time.sleep(0.3)"), timeout=90, stall=2)
    assert r.ok and r.stall is None, r.reason


def test_on_sample_and_on_event_feed_a_live_view():
    samples, events = [], []
    body = "if i == 25:\n            os.kill(os.getpid(), signal.SIGKILL)\n        time.sleep(0.05)"
    r = run_isolated(loader(n=40, body=body), timeout=90, on_sample=samples.append, on_event=events.append)
    assert r.outcome == "failed"
    keys = {"t", "pid", "role", "name", "rss", "uss", "fds", "shm_bytes", "batches"}
    assert samples and all(keys <= set(s) for s in samples)
    roles = {s["role"] for s in samples}
    assert {"main", "worker"} <= roles
    main = [s for s in samples if s["role"] == "main"]
    span = main[-1]["t"] - main[0]["t"]
    assert span > 0.5 and len(main) >= 2 * span  # at least twice a second
    assert max(s["batches"] for s in main) >= 1
    assert all(s["rss"] > 0 for s in samples if not s.get("final"))
    fds = [s["fds"] for s in samples if s["fds"] is not None]  # None: the process ended while sampled
    assert len(fds) >= 0.9 * len(samples) and min(fds) >= 3
    killed = [e for e in events if e["role"] == "worker" and e["signal"] == 9]
    assert len(killed) == 1, events
    assert killed[0]["pid"] in {w.pid for w in r.dataloader_workers if w.signal == 9}
    assert {"t", "pid", "by"} <= set(killed[0]) and killed[0]["by"] is None


def test_the_live_feed_ends_with_the_run_s_final_batch_count(tmp_path):
    """Batches that come after the main process's last sample (a crash or an exit just after them) still
    reach the live chart: the monitor sends the final count once more when the run has ended."""
    import json
    import subprocess
    import sys

    from labutils.runner.monitor import Monitor
    from labutils.runner.spec import RunSpec

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)

    class Ended:  # the run's processes, all gone
        leader, known = int(gone.stdout), {}

        def adopt(self, *args, **kwargs):
            return None

        def alive(self, proc):
            return False

    log = tmp_path / "loader.jsonl"

    def record(**rec):
        with open(log, "a") as fh:
            fh.write(json.dumps(rec) + "\n")

    samples = []
    monitor = Monitor(Ended(), str(tmp_path), RunSpec(mode="code", on_sample=samples.append))
    record(event="iter", t=time.time(), iter=1)
    record(event="progress", t=time.time(), batches=3, iter=1)
    monitor.start()
    time.sleep(0.2)
    monitor._reported_batches = 3  # as if the main process's last sample had carried 3
    record(event="progress", t=time.time(), batches=7, iter=1)  # written just before the end
    monitor.finish()
    assert [(s["role"], s["batches"], s["final"], s["rss"]) for s in samples] == [("main", 7, True, None)]
    again = []
    monitor.on_sample = again.append
    monitor.finish()  # nothing new: nothing more is sent
    assert again == []


def test_a_broken_listener_does_not_stop_the_run():
    def boom(sample):
        raise RuntimeError("listener bug")

    r = run_isolated(loader(n=10), timeout=90, on_sample=boom)
    assert r.ok, r.stderr
