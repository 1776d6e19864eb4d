"""``labutils.lab()``: an ipywidgets front end over the scenarios, the isolated runner and the diagnosis.

Pick a scenario, broken or fixed, turn the knobs it accepts (on the DataLoader and on the run's
limits), say which cause you expect, press Run: the script runs isolated in a background thread, a
chart of every process of the run (memory, fds, /dev/shm, batches) grows while it goes, each death is
marked on it, and the result card appears under it. "Broken vs fixed" shows the diff of the two scripts
and both results; the "Your code" tab runs a pasted script or a file the same way; the "Class" tab keeps
the score and exports the answers (CSV or JSON).

All logic lives in :class:`LabUI` so it can be driven without a browser: set the widgets' ``value`` and
call :meth:`LabUI.run` (blocking) or :meth:`LabUI.start` + :meth:`LabUI.wait` (what the button does).
That is what the tests and the notebooks' non-interactive cells do.
"""

from __future__ import annotations

import csv
import difflib
import html
import json
import os
import re
import threading
import time
from typing import Optional

from ..runner.isolate import IsolationError, run_isolated
from ..runner.result import RunResult

__all__ = ["LabUI", "lab", "script_knob_defaults", "script_diff_html"]

_WIDE = {"description_width": "initial"}
_KNOB_RE = re.compile(r'os\.environ\.get\(\s*"LAB_([A-Z_]+)"\s*,\s*"([^"]*)"\s*\)')
_SHARING = ("file_descriptor", "file_system")


def script_knob_defaults(path: str) -> dict:
    """``{knob: default text}`` for every ``os.environ.get("LAB_KNOB", "default")`` the script reads."""
    with open(path, encoding="utf-8") as fh:
        return {name.lower(): value for name, value in _KNOB_RE.findall(fh.read())}


def script_diff_html(broken_path: str, fixed_path: str) -> str:
    """A unified diff of the broken and the fixed script, coloured, as an HTML ``<pre>``."""
    with open(broken_path, encoding="utf-8") as fh:
        a = fh.read().splitlines()
    with open(fixed_path, encoding="utf-8") as fh:
        b = fh.read().splitlines()
    lines = []
    for line in difflib.unified_diff(a, b, os.path.basename(broken_path), os.path.basename(fixed_path), lineterm=""):
        colour = {"+": "#1a7f37", "-": "#cf222e", "@": "#8250df"}.get(line[:1], "#24292f")
        lines.append(f"<span style='color:{colour}'>{html.escape(line)}</span>")
    body = "\n".join(lines) or "(the two scripts are the same file)"
    return f"<pre class='lab-diff' style='font-size:85%;line-height:1.3'>{body}</pre>"


class LabUI:
    """The widgets and their handlers. ``LabUI().widget`` is what a notebook displays."""

    def __init__(self, scenario: str = "worker_exception", which: str = "broken"):
        import ipywidgets as w

        from ..diagnosis.causes import CAUSES
        from .live import LiveView
        from .tour import SCENARIOS

        self.scenarios = SCENARIOS
        if scenario not in SCENARIOS:
            raise KeyError(f"unknown scenario {scenario!r}; choose one of: {', '.join(SCENARIOS)}")
        wide = w.Layout(width="95%")
        self.scenario = w.Dropdown(
            options=[(f"{s.id}: {s.title}", s.id) for s in SCENARIOS.values()],
            value=scenario,
            description="Scenario",
            layout=wide,
            style=_WIDE,
        )
        self.which = w.ToggleButtons(options=["broken", "fixed"], value=which, description="Version", style=_WIDE)
        # limits of the run (run_isolated options)
        self.start_method = w.Dropdown(
            options=["(script's)", "fork", "spawn", "forkserver"], description="Start method", style=_WIDE
        )
        self.timeout = w.BoundedFloatText(value=60, min=1, max=600, description="Timeout (s)", style=_WIDE)
        self.stall = w.BoundedFloatText(value=15, min=1, max=600, description="Stall limit (s)", style=_WIDE)
        self.memory_budget = w.Text(value="", placeholder="e.g. 400M", description="Memory budget", style=_WIDE)
        self.shm_size = w.Text(value="", placeholder="e.g. 8M", description="/dev/shm size", style=_WIDE)
        self.nofile = w.Text(value="", placeholder="e.g. 128", description="Open files limit", style=_WIDE)
        # knobs on the DataLoader (LAB_* environment variables the scripts read)
        self.num_workers = w.IntSlider(value=2, min=0, max=8, description="num_workers", style=_WIDE)
        self.batch_size = w.IntSlider(value=8, min=1, max=64, description="batch_size", style=_WIDE)
        self.prefetch_factor = w.IntSlider(value=2, min=1, max=8, description="prefetch_factor", style=_WIDE)
        self.pin_memory = w.Checkbox(value=False, description="pin_memory", style=_WIDE)
        self.persistent_workers = w.Checkbox(value=False, description="persistent_workers", style=_WIDE)
        self.sharing_strategy = w.Dropdown(options=_SHARING, description="Sharing strategy", style=_WIDE)
        self.knob_widgets = {
            "start_method": self.start_method,
            "timeout": self.timeout,
            "stall": self.stall,
            "memory_budget": self.memory_budget,
            "shm_size": self.shm_size,
            "nofile": self.nofile,
            "num_workers": self.num_workers,
            "batch_size": self.batch_size,
            "prefetch_factor": self.prefetch_factor,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers,
            "sharing_strategy": self.sharing_strategy,
        }
        for name, widget in self.knob_widgets.items():
            widget.add_class(f"lab-knob-{name}")
        self.knob_box = w.HBox(layout=w.Layout(flex_flow="row wrap"))
        # predict, then run
        self.prediction = w.Dropdown(
            options=[("(no guess)", "")] + [(c, c) for c in CAUSES] + [("unknown", "unknown")],
            description="I expect the cause",
            style=_WIDE,
        )
        self.learner = w.Text(value="", placeholder="your name (for the class sheet)", description="Name", style=_WIDE)
        self.show_code = w.Checkbox(value=False, description="Show the script", style=_WIDE)
        self.button = w.Button(description="Run", button_style="primary", icon="play")
        self.button.add_class("lab-run")
        self.compare_button = w.Button(description="Broken vs fixed", icon="columns", layout=w.Layout(width="auto"))
        self.compare_button.add_class("lab-compare")
        self.status = w.HTML()
        self.status.add_class("lab-status")
        self.verdict = w.HTML()
        self.verdict.add_class("lab-verdict")
        self.code = w.Output()
        self.output = w.Output()
        self.output.add_class("lab-card")
        self.compare = w.Output()
        self.live = LiveView()
        # your own code
        self.user_code = w.Textarea(
            value="",
            placeholder="paste a script with a Dataset and a DataLoader loop",
            layout=w.Layout(width="95%", height="220px"),
        )
        self.user_path = w.Text(
            value="", placeholder="or the path of a .py file", description="File", layout=wide, style=_WIDE
        )
        self.user_button = w.Button(
            description="Run my code", button_style="primary", icon="play", layout=w.Layout(width="auto")
        )
        self.user_button.add_class("lab-run-mine")
        # the class sheet
        self.score = w.HTML()
        self.export_path = w.Text(
            value="lab_answers.csv", description="Export to", style=_WIDE, layout=w.Layout(width="60%")
        )
        self.export_button = w.Button(description="Export answers", icon="download", layout=w.Layout(width="auto"))
        self.answers: list = []
        self.last: Optional[RunResult] = None
        self.results: dict = {}
        self._thread: Optional[threading.Thread] = None

        self.scenario.observe(self._on_scenario, names="value")
        self.which.observe(self._on_scenario, names="value")
        self.show_code.observe(lambda _change: self._render_code(), names="value")
        self.button.on_click(lambda _b: self.start())
        self.compare_button.on_click(lambda _b: self.start(compare=True))
        self.user_button.on_click(lambda _b: self.start(own=True))
        self.export_button.on_click(lambda _b: self._export_clicked())
        self._on_scenario()
        self._render_score()

        scenario_tab = w.VBox(
            [
                self.scenario,
                self.which,
                self.knob_box,
                w.HBox([self.prediction, self.learner]),
                w.HBox([self.button, self.compare_button, self.show_code]),
                self.code,
            ]
        )
        own_tab = w.VBox(
            [
                w.HTML(
                    "Paste a script (it runs as <code>python script.py</code>, isolated, with "
                    "the start method and limits below) or give a file path."
                ),
                self.user_code,
                self.user_path,
                w.HBox(
                    [self.start_method, self.timeout, self.memory_budget, self.nofile],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                self.user_button,
            ]
        )
        class_tab = w.VBox([self.score, w.HBox([self.export_path, self.export_button])])
        self.tabs = w.Tab(children=[scenario_tab, own_tab, class_tab])
        self.tabs.titles = ("Scenarios", "Your code", "Class")
        self.widget = w.VBox([self.tabs, self.status, self.live.widget, self.verdict, self.output, self.compare])
        self.widget.add_class("lab-root")

    # ----------------------------------------------------------------- scenario and knobs
    @property
    def current(self):
        return self.scenarios[self.scenario.value]

    def offered_knobs(self) -> tuple:
        """The knobs the chosen scenario declares (the registry), in the lab's order."""
        return tuple(k for k in self.knob_widgets if k in self.current.knobs)

    def _on_scenario(self, _change=None) -> None:
        """Load the chosen scenario's own limits and its script's knob defaults into the widgets."""
        sc = self.current
        opts = sc.options(self.which.value)
        self.start_method.value = opts.start_method or "(script's)"
        self.timeout.value = opts.timeout or 60
        self.stall.value = opts.stall or 15
        self.memory_budget.value = opts.memory_budget or ""
        self.shm_size.value = opts.shm_size or ""
        self.nofile.value = str(opts.nofile or "")
        defaults = script_knob_defaults(sc.path(self.which.value))
        for name in ("num_workers", "batch_size", "prefetch_factor"):
            if name in defaults:
                self.knob_widgets[name].value = int(defaults[name])
        for name in ("pin_memory", "persistent_workers"):
            if name in defaults:
                self.knob_widgets[name].value = defaults[name] == "1"
        if defaults.get("sharing_strategy") in _SHARING:
            self.sharing_strategy.value = defaults["sharing_strategy"]
        self.knob_box.children = [self.knob_widgets[k] for k in self.offered_knobs()]
        self._render_code()

    def _render_code(self) -> None:
        self.code.clear_output()
        if self.show_code.value:
            with open(self.current.path(self.which.value), encoding="utf-8") as fh:
                text = fh.read()
            self.code.append_stdout(text)  # works headless too, unlike `with self.code: print(...)`

    def knob_env(self) -> dict:
        """The LAB_* environment variables of the offered loader knobs (how they reach the script)."""
        env = {}
        for name in self.offered_knobs():
            if name in ("num_workers", "batch_size", "prefetch_factor", "sharing_strategy"):
                env[f"LAB_{name.upper()}"] = str(self.knob_widgets[name].value)
            elif name in ("pin_memory", "persistent_workers"):
                env[f"LAB_{name.upper()}"] = "1" if self.knob_widgets[name].value else "0"
        return env

    def options(self, which: Optional[str] = None) -> dict:
        """The run_isolated keyword arguments for the chosen scenario: its own limits, changed by the
        knobs it offers (raises IsolationError on bad input)."""
        sc = self.current
        which = which or self.which.value
        base = sc.options(which)
        offered = self.offered_knobs()
        kw = base.kwargs()
        if "start_method" in offered:
            kw["start_method"] = None if self.start_method.value.startswith("(") else self.start_method.value
        if "timeout" in offered:
            kw["timeout"] = float(self.timeout.value)
        if "stall" in offered:
            kw["stall"] = float(self.stall.value)
        if "memory_budget" in offered:
            kw["memory_budget"] = self.memory_budget.value.strip() or None
        if "shm_size" in offered:
            kw["shm_size"] = self.shm_size.value.strip() or None
        if "nofile" in offered:
            nofile = self.nofile.value.strip()
            if nofile and not nofile.isdigit():
                raise IsolationError(f"Open files limit: {nofile!r} is not a whole number; give e.g. 128")
            kw["nofile"] = int(nofile) if nofile else None
        kw["env"] = self.knob_env()
        return kw

    # ----------------------------------------------------------------- running
    def start(self, compare: bool = False, own: bool = False) -> bool:
        """What the buttons do: the run goes in a background thread; False if one is already going."""
        if self.busy:
            self.status.value = "a run is already going: wait for its card"
            return False
        self._thread = threading.Thread(target=self._job, args=(compare, own), daemon=True, name="labutils-lab-run")
        self._set_busy(True)
        self._thread.start()
        return True

    def wait(self, timeout: Optional[float] = None) -> Optional[RunResult]:
        """Wait for the background run; returns the last result."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.last

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _set_busy(self, busy: bool) -> None:
        for b in (self.button, self.compare_button, self.user_button):
            b.disabled = busy

    def _job(self, compare: bool, own: bool) -> None:
        try:
            if own:
                self.run_own()
            elif compare:
                self.run_compare()
            else:
                self.run()
        except Exception as exc:  # noqa: BLE001 - shown in the status line; the kernel must not see it
            self.status.value = f"<span style='color:#cf222e'>the lab failed: {html.escape(repr(exc))}</span>"
        finally:
            self._set_busy(False)

    def _isolated(self, title: str, **kw) -> RunResult:
        """One isolated run with the live view following it."""
        rec = self.live.start(title)
        try:
            return run_isolated(on_sample=rec.on_sample, on_event=rec.on_event, **kw)
        finally:
            self.live.stop()

    def run(self) -> Optional[RunResult]:
        """Run the chosen script isolated (blocking), with the live chart, the verdict on the learner's
        guess and the card; returns the RunResult (None on bad input)."""
        sc, which = self.current, self.which.value
        self.output.clear_output()
        self.compare.clear_output()
        self.verdict.value = ""
        try:
            opts = self.options()
            self.status.value = f"running {sc.id} ({which})..."
            result = self._isolated(f"{sc.id} ({which})", file=sc.path(which), **opts)
        except (IsolationError, ValueError) as exc:
            self.status.value = f"<span style='color:#cf222e'>{html.escape(str(exc))}</span>"
            return None
        self.last = result
        self.status.value = (
            f"{sc.id} ({which}): <b>{result.outcome}</b>, cause <code>{result.cause}</code> "
            f"(expected for the broken run: {sc.expected}) in {result.wall_time:.1f} s"
        )
        self._judge(result, sc.id, which)
        self.output.append_display_data(result)
        return result

    def run_compare(self) -> dict:
        """Broken, then fixed, with the same knobs; the diff of the two scripts and both cards."""
        import ipywidgets as w

        sc = self.current
        self.output.clear_output()
        self.compare.clear_output()
        self.verdict.value = ""
        results = {}
        try:
            for which in ("broken", "fixed"):
                self.status.value = f"running {sc.id} ({which}) for the comparison..."
                results[which] = self._isolated(f"{sc.id} ({which})", file=sc.path(which), **self.options(which))
        except (IsolationError, ValueError) as exc:
            self.status.value = f"<span style='color:#cf222e'>{html.escape(str(exc))}</span>"
            return results
        self.results = results
        self.last = results["fixed"]
        cards = []
        for which, r in results.items():
            out = w.Output(layout=w.Layout(width="50%"))
            out.append_display_data(w.HTML(f"<b>{which}</b>: {r.outcome}, cause <code>{r.cause}</code>"))
            out.append_display_data(r)
            cards.append(out)
        self.compare.append_display_data(w.HTML(script_diff_html(sc.path("broken"), sc.path("fixed"))))
        self.compare.append_display_data(w.HBox(cards))
        self.status.value = (
            f"{sc.id}: broken -> <code>{results['broken'].cause}</code>, fixed -> <b>{results['fixed'].outcome}</b>"
        )
        self._judge(results["broken"], sc.id, "broken")
        return results

    def run_own(self) -> Optional[RunResult]:
        """Run the pasted script (or the file named) isolated, with the same live view and card."""
        self.output.clear_output()
        self.compare.clear_output()
        self.verdict.value = ""
        code, path = self.user_code.value, self.user_path.value.strip()
        try:
            if code.strip() and path:
                raise IsolationError("give either pasted code or a file path, not both: clear one of them")
            if not code.strip() and not path:
                raise IsolationError("paste a script into the box, or give the path of a .py file")
            if path and not os.path.isfile(path):
                raise IsolationError(f"File: {path!r} is not a file; give the path of a .py script")
            nofile = self.nofile.value.strip()
            if nofile and not nofile.isdigit():
                raise IsolationError(f"Open files limit: {nofile!r} is not a whole number; give e.g. 128")
            kw = {
                "start_method": None if self.start_method.value.startswith("(") else self.start_method.value,
                "timeout": float(self.timeout.value),
                "memory_budget": self.memory_budget.value.strip() or None,
                "shm_size": self.shm_size.value.strip() or None,
                "nofile": int(nofile) if nofile else None,
            }
            kw.update({"file": path} if path else {"code": code})
            self.status.value = "running your code..."
            result = self._isolated(os.path.basename(path) if path else "your code", **kw)
        except (IsolationError, ValueError) as exc:
            self.status.value = f"<span style='color:#cf222e'>{html.escape(str(exc))}</span>"
            return None
        self.last = result
        self.status.value = f"your code: <b>{result.outcome}</b>, cause <code>{result.cause}</code>"
        self._judge(result, "own code", "own")
        self.output.append_display_data(result)
        return result

    # ----------------------------------------------------------------- predict, then run
    def _judge(self, result: RunResult, scenario: str, which: str) -> None:
        guess = self.prediction.value
        d = result.diagnosis
        evidence = "".join(f"<li>{html.escape(str(e))}</li>" for e in list(d.evidence)[:4])
        head = f"The diagnosis: <code>{html.escape(d.cause)}</code> ({d.confidence} confidence)"
        if guess:
            right = guess == d.cause
            self.answers.append(
                {
                    "learner": self.learner.value.strip(),
                    "scenario": scenario,
                    "version": which,
                    "predicted": guess,
                    "diagnosed": d.cause,
                    "correct": right,
                    "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                }
            )
            mark = (
                "<b style='color:#1a7f37'>right</b>"
                if right
                else f"<b style='color:#cf222e'>not quite</b> (you said <code>{html.escape(guess)}</code>)"
            )
            head = f"You expected <code>{html.escape(guess)}</code>: {mark}. " + head
            self.prediction.value = ""
            self._render_score()
        self.verdict.value = f"<div>{head}. What decided it:<ul style='margin:2px 0'>{evidence}</ul></div>"

    @property
    def correct(self) -> int:
        return sum(1 for a in self.answers if a["correct"])

    def _render_score(self) -> None:
        rows = "".join(
            f"<tr><td>{html.escape(a['learner'])}</td><td>{a['scenario']}</td><td>{a['predicted']}</td>"
            f"<td>{a['diagnosed']}</td><td>{'yes' if a['correct'] else 'no'}</td></tr>"
            for a in self.answers
        )
        self.score.value = f"<b>Score: {self.correct} of {len(self.answers)}</b> predictions right" + (
            f"<table><tr><th>name</th><th>scenario</th><th>expected</th><th>diagnosed</th>"
            f"<th>right</th></tr>{rows}</table>"
            if rows
            else ""
        )

    def export_answers(self, path: str) -> str:
        """Write the answers to ``path`` (``.json``: a list of objects; otherwise CSV); returns the path."""
        path = os.path.abspath(os.path.expanduser(path))
        fields = ["learner", "scenario", "version", "predicted", "diagnosed", "correct", "time"]
        if path.endswith(".json"):
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(self.answers, fh, indent=2)
        else:
            with open(path, "w", encoding="utf-8", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=fields)
                writer.writeheader()
                writer.writerows(self.answers)
        return path

    def _export_clicked(self) -> None:
        try:
            where = self.export_answers(self.export_path.value.strip() or "lab_answers.csv")
        except OSError as exc:
            self.status.value = f"<span style='color:#cf222e'>export failed: {html.escape(str(exc))}</span>"
            return
        self.status.value = f"{len(self.answers)} answers written to <code>{html.escape(where)}</code>"


def lab(scenario: str = "worker_exception", which: str = "broken"):
    """Build the interactive lab and return its widget (display it, or leave it last in a cell)."""
    return LabUI(scenario, which).widget
