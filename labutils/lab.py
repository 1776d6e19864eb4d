"""``labutils.lab()``: an ipywidgets front end over the scenarios, the isolated runner and the diagnosis.

Pick a scenario, broken or fixed, adjust the limits, press Run: the script runs isolated and its result
card (cause, evidence, stderr) appears below. All logic lives in :class:`LabUI` so it can be driven
without a browser: set the widgets' ``value`` and call :meth:`LabUI.run` (that is what the tests and the
notebooks' non-interactive cells do).
"""

from __future__ import annotations

from typing import Optional

from .isolate import IsolationError, run_isolated
from .result import RunResult


class LabUI:
    """The widgets and their handlers. ``LabUI().widget`` is what a notebook displays."""

    def __init__(self, scenario: str = "worker_exception", which: str = "broken"):
        import ipywidgets as w

        from .tour import SCENARIOS

        self.scenarios = SCENARIOS
        if scenario not in SCENARIOS:
            raise KeyError(f"unknown scenario {scenario!r}; choose one of: {', '.join(SCENARIOS)}")
        self.scenario = w.Dropdown(options=[(f"{s.id}: {s.title}", s.id) for s in SCENARIOS.values()],
                                   value=scenario, description="Scenario", layout=w.Layout(width="95%"))
        self.which = w.ToggleButtons(options=["broken", "fixed"], value=which, description="Version")
        self.start_method = w.Dropdown(options=["(script's)", "fork", "spawn", "forkserver"],
                                       description="Start method")
        self.timeout = w.BoundedFloatText(value=60, min=1, max=600, description="Timeout (s)")
        self.memory_budget = w.Text(value="", placeholder="e.g. 400M", description="Memory budget")
        self.shm_size = w.Text(value="", placeholder="e.g. 8M", description="/dev/shm size")
        self.nofile = w.Text(value="", placeholder="e.g. 128", description="Open files")
        self.show_code = w.Checkbox(value=False, description="Show the script")
        self.button = w.Button(description="Run", button_style="primary", icon="play")
        self.status = w.HTML()
        self.code = w.Output()
        self.output = w.Output()
        self.last: Optional[RunResult] = None
        self.scenario.observe(self._on_scenario, names="value")
        self.which.observe(self._on_scenario, names="value")
        self.show_code.observe(lambda _change: self._render_code(), names="value")
        self.button.on_click(lambda _button: self.run())
        self._on_scenario()
        self.widget = w.VBox([
            self.scenario, self.which,
            w.HBox([self.start_method, self.timeout]),
            w.HBox([self.memory_budget, self.shm_size, self.nofile]),
            w.HBox([self.button, self.show_code, self.status]), self.code, self.output,
        ])

    # ----------------------------------------------------------------- handlers
    def _on_scenario(self, _change=None) -> None:
        """Load the chosen scenario's own limits into the option widgets."""
        sc = self.scenarios[self.scenario.value]
        opts = sc.options(self.which.value)
        self.start_method.value = opts.start_method or "(script's)"
        self.timeout.value = opts.timeout
        self.memory_budget.value = opts.memory_budget or ""
        self.shm_size.value = opts.shm_size or ""
        self.nofile.value = str(opts.nofile or "")
        self._render_code()

    def _render_code(self) -> None:
        self.code.clear_output()
        if self.show_code.value:
            sc = self.scenarios[self.scenario.value]
            with open(sc.path(self.which.value), encoding="utf-8") as fh:
                text = fh.read()
            self.code.append_stdout(text)  # works headless too, unlike `with self.code: print(...)`

    def options(self) -> dict:
        """The run_isolated keyword arguments the widgets describe (raises IsolationError on bad input)."""
        sc = self.scenarios[self.scenario.value]
        nofile = self.nofile.value.strip()
        if nofile and not nofile.isdigit():
            raise IsolationError(f"Open files: {nofile!r} is not a whole number")
        stall = sc.options(self.which.value).stall  # the scenario's own progress limit (the hang scenario)
        return {
            "start_method": None if self.start_method.value.startswith("(") else self.start_method.value,
            "timeout": float(self.timeout.value),
            **({"stall": stall} if stall is not None else {}),
            "memory_budget": self.memory_budget.value.strip() or None,
            "shm_size": self.shm_size.value.strip() or None,
            "nofile": int(nofile) if nofile else None,
            "notebook_main": sc.options(self.which.value).notebook_main,
        }

    def run(self) -> Optional[RunResult]:
        """Run the chosen script isolated, show its card, and return the RunResult (None on bad input)."""
        sc = self.scenarios[self.scenario.value]
        self.output.clear_output()
        try:
            opts = self.options()
            self.status.value = f"running {sc.id} ({self.which.value})..."
            self.button.disabled = True
            result = run_isolated(file=sc.path(self.which.value), **opts)
        except (IsolationError, ValueError) as exc:
            self.status.value = f"<span style='color:#cf222e'>{exc}</span>"
            return None
        finally:
            self.button.disabled = False
        self.last = result
        self.status.value = (f"{sc.id} ({self.which.value}): <b>{result.outcome}</b>, cause "
                             f"<code>{result.cause}</code> (expected for the broken run: {sc.expected})")
        self.output.append_display_data(result)
        return result


def lab(scenario: str = "worker_exception", which: str = "broken"):
    """Build the interactive lab and return its widget (display it, or leave it last in a cell)."""
    return LabUI(scenario, which).widget
