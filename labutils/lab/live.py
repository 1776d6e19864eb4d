"""The lab's live view: :class:`LiveRecorder`, the listener handed to :func:`labutils.run_isolated`
(``on_sample=rec.on_sample, on_event=rec.on_event``), stores what the runner's monitor reports (no second
sampler) and names the processes; :func:`render_png` draws it as a PNG (the CLI, export). The browser's live
chart is :class:`labutils.lab.chart.LiveChart`, fed by the same recorder.
"""

from __future__ import annotations

import io
import threading
import time
from typing import Optional

from ..machine.probes import shm_used
from ..runner.result import signal_name

__all__ = ["LiveRecorder", "death_text", "render_png"]

MIB = 1024 * 1024
MAX_POINTS = 400  # per line drawn: keeps a redraw fast however long the run
PALETTE = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#9a6700", "#bf3989", "#57606a"]


def death_text(event: dict, label: str = "") -> str:
    """``worker 1 died: SIGKILL (by watchdog)`` from one ``on_event`` record."""
    who = label or f"{event.get('role', 'process')} {event.get('pid')}"
    if event.get("signal"):
        how = signal_name(int(event["signal"]))
    elif event.get("exitcode") is not None:
        how = f"exit code {event['exitcode']}"
    else:
        how = "ended (status not seen)"
    by = {"watchdog": "the lab's memory watchdog", "kernel_oom": "the kernel's OOM killer"}.get(event.get("by"))
    return f"{who} died: {how}" + (f" (killed by {by})" if by else "")


def _tmpfs_used(pid) -> Optional[int]:
    """Bytes in use on /dev/shm as process ``pid`` sees it (its own mount namespace), or None."""
    try:
        return shm_used(f"/proc/{int(pid)}/root/dev/shm")
    except (OSError, TypeError, ValueError):
        return None


class LiveRecorder:
    """Thread-safe store of one run's samples and deaths, as the runner's monitor reports them."""

    def __init__(self, private_shm: bool = False):
        self._lock = threading.Lock()
        self.private_shm = private_shm  # the run has its own /dev/shm: read its tmpfs through /proc/PID/root
        self.samples: list = []
        self.events: list = []
        self.version = 0  # bumped on every record: the view redraws only when it moved
        self.started = time.time()
        self.first_sample_s: Optional[float] = None  # seconds from the recorder's start to the first sample
        self._offset: Optional[float] = None  # wall time minus the monitor's clock (events carry wall time)
        self._names: dict = {}
        self._workers = 0

    def on_sample(self, sample: dict) -> None:
        now = time.time()
        with self._lock:
            if self.first_sample_s is None:
                self.first_sample_s = now - self.started
            offset = now - float(sample.get("t", 0.0))
            self._offset = offset if self._offset is None else min(self._offset, offset)
            self._name(sample)
            sample = dict(sample)
            if self.private_shm and sample.get("role") == "main" and not sample.get("final"):
                sample["shm_tmpfs"] = _tmpfs_used(sample.get("pid"))
            self.samples.append(sample)
            self.version += 1

    def on_event(self, event: dict) -> None:
        with self._lock:
            self._name(event)
            self.events.append(dict(event))
            self.version += 1

    def _name(self, rec: dict) -> str:
        pid = rec.get("pid")
        if pid not in self._names:
            role = rec.get("role")
            if role == "main":
                self._names[pid] = "main"
            elif role == "worker":
                self._names[pid] = f"worker {self._workers}"
                self._workers += 1
            else:
                self._names[pid] = f"{rec.get('name') or 'process'} {pid}"
        return self._names[pid]

    def snapshot(self) -> dict:
        """``{"series": {label: {t, rss, uss, fds, shm}}, "batches": (t, n), "deaths": [(t, text)]}``."""
        with self._lock:
            samples, events, offset = list(self.samples), list(self.events), self._offset
            names = dict(self._names)
        series: dict = {}
        bt, bn = [], []
        for s in samples:
            label = names.get(s["pid"], str(s["pid"]))
            if not s.get("final"):  # the run's last batch count, sent after its processes ended: no memory
                row = series.setdefault(label, {"t": [], "rss": [], "uss": [], "fds": [], "shm": []})
                row["t"].append(s["t"])
                row["rss"].append((s.get("rss") or 0) / MIB)
                row["uss"].append((s["uss"] / MIB) if s.get("uss") is not None else float("nan"))
                row["fds"].append(s["fds"] if s.get("fds") is not None else float("nan"))
                row["shm"].append((s.get("shm_bytes") or 0) / MIB)
            if s.get("batches") is not None:
                bt.append(s["t"])
                bn.append(s["batches"])
        ticks: dict = {}  # one monitor tick: the samples of every process share its time
        for s in samples:
            if not s.get("final"):
                tick = ticks.setdefault(s["t"], {"uss": 0.0, "shm": 0.0, "tmpfs": None})
                tick["uss"] += (s.get("uss") or 0) / MIB
                tick["shm"] += (s.get("shm_bytes") or 0) / MIB
                if s.get("shm_tmpfs") is not None:
                    tick["tmpfs"] = s["shm_tmpfs"] / MIB
        tt = sorted(ticks)
        # /dev/shm in use: the run's own tmpfs where it has one, else the shared pages its processes map
        shm = [ticks[t]["tmpfs"] if ticks[t]["tmpfs"] is not None else ticks[t]["shm"] for t in tt]
        deaths = []
        for e in events:
            t = (e["t"] - offset) if offset is not None else (e["t"] - self.started)
            deaths.append((max(t, 0.0), death_text(e, names.get(e.get("pid"), ""))))
        return {"series": series, "batches": (bt, bn), "deaths": deaths, "n_samples": len(samples),
                "total_uss": (tt, [ticks[t]["uss"] for t in tt]), "shm": (tt, shm),
                "shm_peak_mib": max(shm) if shm else None}


def render_png(
    rec: LiveRecorder, title: str = "", running: bool = True, width: float = 9.5, height: float = 5.2
) -> bytes:
    """The chart of everything recorded so far, as PNG bytes (matplotlib's Agg; no pyplot state)."""
    from matplotlib.figure import Figure

    snap = rec.snapshot()
    fig = Figure(figsize=(width, height), dpi=80, layout="constrained")
    axes = fig.subplots(2, 2, sharex=True)
    (ax_mem, ax_fds), (ax_shm, ax_bat) = axes
    for i, (label, row) in enumerate(snap["series"].items()):
        c = PALETTE[i % len(PALETTE)]
        step = max(1, len(row["t"]) // MAX_POINTS)  # a long run: every step-th sample, and the latest
        if step > 1:
            row = {k: v[::step] + v[-1:] for k, v in row.items()}
        ax_mem.plot(row["t"], row["rss"], color=c, label=f"{label} RSS")
        ax_mem.plot(row["t"], row["uss"], color=c, linestyle="--", linewidth=1)
        ax_fds.plot(row["t"], row["fds"], color=c, label=label)
        ax_shm.plot(row["t"], row["shm"], color=c, label=label)
    bt, bn = snap["batches"]
    ax_bat.plot(bt, bn, color="#0969da")
    ax_mem.set_ylabel("memory (MiB)\nRSS solid, USS dashed")
    ax_fds.set_ylabel("open fds")
    ax_shm.set_ylabel("/dev/shm in use (MiB)")
    ax_bat.set_ylabel("batches delivered")
    for ax in (ax_shm, ax_bat):
        ax.set_xlabel("seconds since the run started")
    t_end = max([row["t"][-1] for row in snap["series"].values() if row["t"]] + [d[0] for d in snap["deaths"]] + [0.5])
    for ax in axes.flat:
        ax.set_xlim(0, t_end * 1.05)
        ax.grid(alpha=0.3)
    for t, text in snap["deaths"]:
        for ax in axes.flat:
            ax.axvline(t, color="#cf222e", linewidth=1.5, alpha=0.8)
        ax_mem.annotate(
            text,
            xy=(t, 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=8,
            color="#cf222e",
            rotation=90,
            va="top",
            ha="right",
        )
    if snap["series"]:
        ax_fds.legend(fontsize=8, loc="upper left")
    state = "running" if running else "finished"
    fig.suptitle(f"{title}  [{state}, {snap['n_samples']} samples, {len(snap['deaths'])} deaths]", fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
