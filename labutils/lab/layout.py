"""The lab's widgets and how they are laid out (no logic: :mod:`labutils.lab.widget` holds the handlers).

Every label here is the same for every case: nothing in a description, a placeholder or a tooltip
depends on which scenario is behind a case, so the page cannot give the answer away.
"""

from __future__ import annotations

from .challenges import CHALLENGES
from .chart import LiveChart
from .paste import paste_panel

__all__ = ["build_layout", "build_widgets"]

_WIDE = {"description_width": "initial"}
#: the CSS class of each widget of the lab, by its attribute
_CSS = {"scenario": "lab-case", "setup": "lab-setup", "prediction": "lab-prediction",
        "guess_batches": "lab-guess-batches", "learner": "lab-learner", "button": "lab-run",
        "reveal_button": "lab-reveal-button", "compare_button": "lab-compare", "status": "lab-status",
        "verdict": "lab-verdict", "code": "lab-code", "printed": "lab-printed", "output": "lab-card",
        "user_code": "lab-user-code", "user_button": "lab-run-mine", "try_button": "lab-try", "score": "lab-score"}


def _knobs(ui, w, sharing) -> None:
    ui.start_method = w.Dropdown(options=["(script's)", "fork", "spawn", "forkserver"], description="Start method",
                                 style=_WIDE)
    ui.timeout = w.BoundedFloatText(value=60, min=1, max=600, description="Time limit (s)", style=_WIDE)
    ui.stall = w.BoundedFloatText(value=15, min=1, max=600, description="Stall limit (s)", style=_WIDE)
    ui.memory_budget = w.Text(value="", placeholder="e.g. 400M", description="Memory budget", style=_WIDE)
    ui.shm_size = w.Text(value="", placeholder="e.g. 8M", description="/dev/shm size", style=_WIDE)
    ui.nofile = w.Text(value="", placeholder="e.g. 128", description="Open files limit", style=_WIDE)
    ui.num_workers = w.IntSlider(value=2, min=0, max=8, description="num_workers", style=_WIDE)
    ui.batch_size = w.IntSlider(value=8, min=1, max=64, description="batch_size", style=_WIDE)
    ui.prefetch_factor = w.IntSlider(value=2, min=1, max=8, description="prefetch_factor", style=_WIDE)
    ui.pin_memory = w.Checkbox(value=False, description="pin_memory", style=_WIDE)
    ui.persistent_workers = w.Checkbox(value=False, description="persistent_workers", style=_WIDE)
    ui.sharing_strategy = w.Dropdown(options=sharing, description="Sharing strategy", style=_WIDE)
    ui.knob_widgets = {name: getattr(ui, name) for name in (
        "start_method", "timeout", "stall", "memory_budget", "shm_size", "nofile", "num_workers", "batch_size",
        "prefetch_factor", "pin_memory", "persistent_workers", "sharing_strategy")}
    for name, widget in ui.knob_widgets.items():
        widget.add_class(f"lab-knob-{name}")
    ui.knob_box = w.HBox(layout=w.Layout(flex_flow="row wrap"))


def build_widgets(ui, prediction_options: list, sharing: tuple) -> None:
    """Make every widget of the lab as an attribute of ``ui``."""
    import ipywidgets as w

    wide = w.Layout(width="95%")
    ui.scenario = w.Dropdown(description="Case", layout=w.Layout(width="60%"), style=_WIDE)
    ui.which = w.ToggleButtons(options=["broken", "fixed"], value="broken", description="Version", style=_WIDE)
    ui.setup = w.HTML()
    _knobs(ui, w, sharing)
    ui.prediction = w.Dropdown(options=prediction_options, description="My prediction", style=_WIDE,
                               layout=w.Layout(width="95%"))
    ui.guess_batches = w.Text(value="", placeholder="optional", description="Batches delivered before it ends",
                              style=_WIDE)
    ui.guess_shm = w.Text(value="", placeholder="optional", description="/dev/shm peak (MiB)", style=_WIDE)
    ui.learner = w.Text(value="", placeholder="your name (deals your cases)", description="Name", style=_WIDE)
    ui.show_code = w.Checkbox(value=False, description="Show the script", style=_WIDE)
    ui.button = w.Button(description="Run", button_style="primary", icon="play")
    ui.reveal_button = w.Button(description="Reveal", icon="eye", disabled=True)
    ui.compare_button = w.Button(description="Broken vs fixed", icon="columns", layout=w.Layout(width="auto"))
    ui.status = w.HTML()
    ui.verdict = w.HTML()
    ui.code, ui.printed, ui.output, ui.compare = w.Output(), w.Output(), w.Output(), w.Output()
    ui.live = LiveChart()
    ui.user_code = w.Textarea(value="", placeholder="paste a script with a Dataset and a DataLoader loop",
                              layout=w.Layout(width="95%", height="220px"))
    ui.user_path = w.Text(value="", placeholder="or the path of a .py file", description="File", layout=wide,
                          style=_WIDE)
    ui.user_button = w.Button(description="Run my code", button_style="primary", icon="play",
                              layout=w.Layout(width="auto"))
    ui.challenge = w.Dropdown(options=[(f"Challenge {i + 1}", cid) for i, cid in enumerate(CHALLENGES)],
                              description="Challenge", style=_WIDE)
    ui.challenge_text = w.HTML()
    ui.try_button = w.Button(description="Try", icon="flag-checkered", layout=w.Layout(width="auto"))
    ui.score = w.HTML()
    ui.export_path = w.Text(value="lab_answers_anonymous.csv", description="Export to", style=_WIDE,
                            layout=w.Layout(width="60%"))
    ui.export_button = w.Button(description="Export the sheet", icon="download", layout=w.Layout(width="auto"))
    for name, css in _CSS.items():  # what the browser tests and the page's style find
        getattr(ui, name).add_class(css)


def build_layout(ui) -> None:
    """Put the widgets of ``ui`` into tabs; ``ui.widget`` is the whole lab."""
    import ipywidgets as w

    row = w.Layout(flex_flow="row wrap")
    scenario_tab = w.VBox([
        w.HBox([ui.learner, ui.scenario], layout=row), ui.setup, ui.which, ui.knob_box,
        ui.prediction, w.HBox([ui.guess_batches, ui.guess_shm], layout=row),
        w.HBox([ui.button, ui.reveal_button, ui.compare_button, ui.show_code], layout=row), ui.code,
    ])
    own_tab = w.VBox([
        w.HTML("Paste a script (it runs as <code>python script.py</code>, isolated, with the start method "
               "and limits below) or give a file path."),
        ui.user_code, ui.user_path,
        w.HBox([ui.start_method, ui.timeout, ui.memory_budget, ui.nofile], layout=row),
        ui.user_button,
    ])
    challenge_tab = w.VBox([ui.challenge, ui.challenge_text, ui.try_button])
    class_tab = w.VBox([ui.score, w.HBox([ui.export_path, ui.export_button])])
    ui.paste = paste_panel()  # the text of a log you have: the same diagnosis as `diagnose --log`
    ui.tabs = w.Tab(children=[scenario_tab, own_tab, ui.paste, challenge_tab, class_tab])
    ui.tabs.titles = ("Cases" if ui.mystery else "Scenarios", "Your code", "Paste your error", "Challenges", "Class")
    ui.widget = w.VBox([ui.tabs, ui.status, ui.live.widget, ui.printed, ui.verdict, ui.output, ui.compare])
    ui.widget.add_class("lab-root")
