"""Evidence the diagnosis and the live lab read: init errors, progress, stalls with every stack, a live feed."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time

from labutils import run_isolated
from labutils.runner import rundir as _rd

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


def test_output_is_read_to_a_cap_and_the_result_says_what_was_cut(monkeypatch):
    from labutils.runner import evidence

    monkeypatch.setattr(evidence, "OUTPUT_CAP", 64 * 1024)
    r = run_isolated("import sys\nfor i in range(40000):\n    print(f'line {i:06d}')\n", timeout=60)
    assert r.ok
    cut = r.truncated["stdout"]
    assert cut["size"] == 40000 * 12 and cut["cap"] == 64 * 1024 and cut["cut"] == cut["size"] - 64 * 1024
    assert len(r.stdout) < 70 * 1024 and "line 000000" in r.stdout and "line 039999" in r.stdout
    assert "bytes cut here" in r.stdout and "stderr" not in r.truncated


def test_a_run_that_floods_its_output_is_stopped(monkeypatch):
    from labutils.runner import monitor

    monkeypatch.setattr(monitor, "OUTPUT_LIMIT", 4 * 2**20)
    r = run_isolated("while True:\n    print('x' * 1000)\n", timeout=60)
    assert r.outcome == "failed" and "MiB to stdout/stderr" in r.reason and r.wall_time < 30, r.reason


def test_a_run_that_floods_its_evidence_records_is_stopped(monkeypatch):
    """labutils.emit in a loop writes nothing to stdout, but fills RUN_DIR/emitted.jsonl in the shared /tmp."""
    from labutils.runner import monitor

    monkeypatch.setattr(monitor, "EVIDENCE_LIMIT", 2 * 2**20)
    r = run_isolated("import labutils\nwhile True:\n    labutils.emit(x='y' * 1000)\n", timeout=60)
    assert r.outcome == "failed" and "emitted.jsonl" in r.reason and r.wall_time < 30, (r.outcome, r.reason)


def test_one_chain_walk_for_the_kernel_the_diagnosis_and_the_notebook_preamble():
    import runpy

    from labutils.diagnosis import chain
    from labutils.diagnosis.evidence import _chain_of
    from labutils.runner import notebook

    try:
        try:
            raise ValueError("inner")
        except ValueError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as exc:
        err = exc
    assert [(type(e).__name__, link) for e, link in chain.links(err)] == [("RuntimeError", None),
                                                                          ("ValueError", "cause")]
    assert [(c.type, c.link) for _, c in _chain_of(err)] == [("RuntimeError", None), ("ValueError", "cause")]
    recs = chain.records(err)
    assert [(r["type"], r["link"], r["message"]) for r in recs] == [("RuntimeError", None, "outer"),
                                                                     ("ValueError", "cause", "inner")]
    preamble = runpy.run_path(os.path.join(os.path.dirname(notebook.__file__), "kernel_preamble.py"))
    assert os.path.samefile(preamble["_chain"].__code__.co_filename, chain.__file__)  # it runs this very file


def test_evidence_records_are_read_to_a_cap(tmp_path):
    from labutils.runner.rundir import read_json, read_jsonl

    path = tmp_path / _rd.LOADER
    path.write_text((json.dumps({"event": "error", "text": "x" * 100}) + "\n") * 5000)  # about 560 kB
    records = read_jsonl(str(path), cap=20_000)
    assert 0 < len(records) < 200, len(records)
    big = tmp_path / _rd.VALUE
    big.write_text(json.dumps({"v": "y" * 100_000}))
    assert read_json(str(big), cap=1000) is None  # cut, so not valid JSON: read as no record, not whole
