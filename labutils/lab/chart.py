"""The lab's live chart, drawn by the browser: bqplot marks whose data the kernel updates while a run goes.

An update is new numbers for the page, not a picture, so the chart follows the runner's sampler at several
updates a second even on a loaded machine (a matplotlib PNG made in the kernel managed about one). Four
panels share the time axis (:data:`PANELS`); each limit of the run is a dashed red line on its panel, each
death a red vertical line, and a run started with ``overlay=True`` is drawn over the last one, dashed.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

from ..runner.sizes import parse_size
from .live import PALETTE, LiveRecorder, render_png

__all__ = ["LiveChart", "parse_size_mib"]

PANELS = (("mem", "memory (MiB)"), ("fds", "open fds"), ("shm", "/dev/shm in use (MiB)"),
          ("batches", "batches delivered"))


def parse_size_mib(text) -> Optional[float]:
    """``"800M"`` -> 800.0, ``"1G"`` -> 1024.0, ``"8388608"`` (bytes) -> 8.0; None when empty or unreadable."""
    try:
        return parse_size(str(text or "")) / 2**20 if str(text or "").strip() else None
    except ValueError:
        return None


class _Panel:
    """One bqplot Figure: its y scale, its lines by key, one limit line and the death lines."""

    def __init__(self, bq, w, x_scale, label: str):
        self.bq, self.x = bq, x_scale
        self.y = bq.LinearScale(min=0)
        self.unit = bq.LinearScale(min=0, max=1)  # for the vertical death lines: bottom to top of the panel
        axes = [bq.Axis(scale=x_scale, label="seconds since the run started", grid_lines="dashed"),
                bq.Axis(scale=self.y, side="left", label=label, grid_lines="dashed")]
        self.lines: dict = {}
        self.limit = bq.Lines(x=[0.0, 1.0], y=[0.0, 0.0], scales={"x": x_scale, "y": self.y},
                              colors=["#cf222e"], line_style="dashed", stroke_width=2, visible=False)
        self.limit_label = bq.Label(x=[0.0], y=[0.0], text=[""], scales={"x": x_scale, "y": self.y},
                                    colors=["#cf222e"], default_size=11, visible=False)
        self.deaths = bq.Lines(x=[[0.0, 0.0]], y=[[0.0, 1.0]], scales={"x": x_scale, "y": self.unit},
                               colors=["#cf222e"], stroke_width=1.5, visible=False)
        self.figure = bq.Figure(marks=[self.limit, self.limit_label, self.deaths], axes=axes,
                                title=label, legend_location="top-left",
                                fig_margin={"top": 30, "bottom": 40, "left": 55, "right": 10},
                                layout=w.Layout(width="49%", height="230px"), animation_duration=0)

    def line(self, key: tuple, colour: str, dashed: bool, label: str, width: float = 1.8):
        if key not in self.lines:
            mark = self.bq.Lines(x=[0.0], y=[0.0], scales={"x": self.x, "y": self.y}, colors=[colour],
                                 line_style="dashed" if dashed else "solid", stroke_width=width,
                                 labels=[label], display_legend=True)
            self.lines[key] = mark
            self.figure.marks = list(self.figure.marks) + [mark]
        mark = self.lines[key]
        if list(mark.labels) != [label]:  # a second run joined: the first one's legend names it now
            mark.labels = [label]
        return mark

    def set_limit(self, value: Optional[float], text: str, t_end: float) -> None:
        self.limit.visible = self.limit_label.visible = value is not None
        if value is not None:
            with self.limit.hold_sync():
                self.limit.x, self.limit.y = [0.0, t_end], [value, value]
            self.limit_label.x, self.limit_label.y, self.limit_label.text = [0.0], [value], [text]

    def clear(self) -> None:
        self.figure.marks = [self.limit, self.limit_label, self.deaths]
        self.lines = {}
        self.deaths.visible = False


class LiveChart:
    """The bqplot live chart of one or two runs (``start`` a run, ``stop`` it; ``overlay`` keeps the last)."""

    def __init__(self, interval: float = 0.125):
        import bqplot as bq
        import ipywidgets as w

        self.interval = interval  # seconds between updates while a run goes (8 a second at most)
        self.x = bq.LinearScale(min=0)
        self.panels = {key: _Panel(bq, w, self.x, label) for key, label in PANELS}
        self.caption = w.HTML()
        self.caption.add_class("lab-chart-caption")
        self.deaths_text = w.HTML()
        box = w.Box([p.figure for p in self.panels.values()], layout=w.Layout(flex_flow="row wrap", width="100%"))
        box.add_class("lab-chart")
        self.widget = w.VBox([self.caption, box, self.deaths_text])
        self.runs: list = []  # [(title, recorder)] drawn, the last one live
        self.limits: dict = {}
        self.title = ""
        self.updates = 0
        self.update_times: list = []  # monotonic time of every update made while a run went
        self.recorder: Optional[LiveRecorder] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def start(self, title: str = "", limits: Optional[dict] = None, overlay: bool = False) -> LiveRecorder:
        """A fresh recorder drawn from now on; ``limits`` = {memory_budget, nofile, shm_size} of the run."""
        self.stop()
        if not overlay:
            self.runs = []
            for p in self.panels.values():
                p.clear()
        self.title, self.limits = title, dict(limits or {})
        self.update_times = []
        self.recorder = LiveRecorder()
        self.runs.append((title, self.recorder))
        self.caption.value = f"<b>{title}</b>: starting..."
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(self.recorder, self._stop), daemon=True,
                                        name="labutils-live-chart")
        self._thread.start()
        return self.recorder

    def _loop(self, rec: LiveRecorder, stop: threading.Event) -> None:
        drawn, due = -1, time.monotonic()
        while True:  # a fixed schedule: a slow update does not push the next ones back
            due += self.interval
            if stop.wait(max(0.0, due - time.monotonic())):
                return
            due = max(due, time.monotonic() - self.interval)
            if rec.version != drawn:
                drawn = rec.version
                self.draw(running=True)

    def stop(self) -> None:
        """Stop following the run and draw its final state (also for a run shorter than one update)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None
            self.draw(running=False)

    def updates_per_second(self) -> Optional[float]:
        """Updates a second while the last run went (None with fewer than two updates)."""
        t = self.update_times
        if len(t) < 2 or t[-1] <= t[0]:
            return None
        return (len(t) - 1) / (t[-1] - t[0])

    def png(self) -> bytes:
        """The last run as a PNG (matplotlib), for export and for places without a browser."""
        return render_png(self.recorder or LiveRecorder(), self.title, running=False)

    def draw(self, running: bool) -> None:
        """Push every run's data to the marks (one update); a failure is shown, never raised."""
        with self._lock:
            try:
                t_end = self._draw_runs()
                self._draw_limits(t_end)
                self.updates += 1
                if running:
                    self.update_times.append(time.monotonic())
                rec = self.recorder
                n = len(rec.samples) if rec else 0
                first = "" if rec is None or rec.first_sample_s is None else \
                    f", first sample after {rec.first_sample_s:.2f} s"
                self.caption.value = (f"<b>{self.title}</b>: {'running' if running else 'finished'}, "
                                      f"{n} samples{first}, chart updated {self.updates} times")
            except Exception as exc:  # noqa: BLE001 - a drawing failure must not stop the run
                self.caption.value = f"chart failed: {exc!r}"

    def _draw_runs(self) -> float:
        t_end, deaths = 0.5, []
        for r, (title, rec) in enumerate(self.runs):
            snap = rec.snapshot()
            dashed = r > 0
            tag = f" ({title})" if len(self.runs) > 1 else ""
            for i, (label, row) in enumerate(snap["series"].items()):
                colour = PALETTE[i % len(PALETTE)]
                if row["t"]:
                    t_end = max(t_end, row["t"][-1])
                self._set(self.panels["mem"].line((r, label), colour, dashed, f"{label} RSS{tag}"),
                          row["t"], row["rss"])
                self._set(self.panels["fds"].line((r, label), colour, dashed, f"{label}{tag}"), row["t"], row["fds"])
            tt, total = snap["total_uss"]
            self._set(self.panels["mem"].line((r, "total"), "#24292f", dashed, f"all processes, USS{tag}", 2.5),
                      tt, total)
            st, shm = snap["shm"]
            self._set(self.panels["shm"].line((r, "shm"), "#8250df", dashed, f"in use{tag}"), st, shm)
            bt, bn = snap["batches"]
            self._set(self.panels["batches"].line((r, "batches"), "#0969da", dashed, f"batches{tag}"), bt, bn)
            t_end = max([t_end] + list(bt) + [d[0] for d in snap["deaths"]])
            deaths += [(t, f"{text}{tag}") for t, text in snap["deaths"]]
        for key in ("mem", "batches"):
            marks = self.panels[key].deaths
            marks.visible = bool(deaths)
            if deaths:
                with marks.hold_sync():
                    marks.x = [[t, t] for t, _ in deaths]
                    marks.y = [[0.0, 1.0] for _ in deaths]
        self.deaths_text.value = "".join(f"<div style='color:#cf222e'>{t:.2f} s: {text}</div>" for t, text in deaths)
        self.x.max = t_end * 1.05
        return t_end * 1.05

    @staticmethod
    def _set(mark, xs, ys) -> None:
        pts = [(x, y) for x, y in zip(xs, ys) if y == y]  # drop NaN (a figure the sampler did not get)
        with mark.hold_sync():
            mark.x = [p[0] for p in pts] or [0.0]
            mark.y = [p[1] for p in pts] or [0.0]

    def _draw_limits(self, t_end: float) -> None:
        budget = parse_size_mib(self.limits.get("memory_budget"))
        self.panels["mem"].set_limit(budget, f"memory budget {self.limits.get('memory_budget')}", t_end)
        nofile = self.limits.get("nofile")
        self.panels["fds"].set_limit(float(nofile) if nofile else None, f"open files limit {nofile}", t_end)
        shm = parse_size_mib(self.limits.get("shm_size"))
        self.panels["shm"].set_limit(shm, f"/dev/shm size {self.limits.get('shm_size')}", t_end)
