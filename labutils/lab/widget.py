"""``labutils.lab()``: an ipywidgets front end over the scenarios, the isolated runner and the diagnosis.

By default a game (*mystery mode*, :mod:`labutils.lab.game`): the scenarios are cases dealt per learner, whose
identity stays hidden until the learner has predicted and the run has ended; the reveal then opens the case's
knobs, "Broken vs fixed" and its challenges (:mod:`labutils.lab.challenges`). ``LabUI(mystery=False)`` is an
instructor's sandbox: every scenario by its id, knobs open from the start.

All logic lives in :class:`LabUI` so it can be driven without a browser: set the widgets' ``value`` and
call :meth:`LabUI.run` (blocking) or :meth:`LabUI.start` + :meth:`LabUI.wait` (what the button does).
"""

from __future__ import annotations

import difflib
import html
import os
import re
import threading
from typing import Optional

from ..diagnosis.causes import CATALOGUE, CAUSES
from ..runner import isolate
from ..runner.isolate import IsolationError, run_isolated
from ..runner.result import RunResult
from ..scenarios import SCENARIOS
from . import game
from .card import Card, stderr_view
from .challenges import CHALLENGES, playable, score_attempt
from .layout import build_layout, build_widgets

__all__ = ["LabUI", "lab", "script_knob_defaults", "script_diff_html"]

_KNOB_RE = re.compile(r'os\.environ\.get\(\s*"LAB_([A-Z_]+)"\s*,\s*"([^"]*)"\s*\)')
_SHARING = ("file_descriptor", "file_system")
_BUSY = "a run is already going: wait for it to end, then run again"
_OUTCOME_WORDS = {"ok": "it finished", "failed": "it failed", "timed_out": "the lab stopped it at a limit",
                  "unsupported": "this machine cannot run it"}


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


#: what a locked challenge says: which case it is about, or its target, would name that case's cause
_LOCKED = ("Locked: a challenge opens once you have revealed the case it is about. Play the cases: predict, run, "
           "reveal.")


def _red(text: str) -> str:
    return f"<span style='color:#cf222e'>{html.escape(text)}</span>"


class LabUI:
    """The widgets and their handlers. ``LabUI().widget`` is what a notebook displays."""

    def __init__(self, scenario: Optional[str] = None, which: str = "broken", mystery: bool = True,
                 learner: str = ""):
        self.scenarios, self.mystery = SCENARIOS, mystery
        if scenario is not None and scenario not in SCENARIOS:
            raise KeyError(f"unknown scenario {scenario!r}; choose one of: {', '.join(SCENARIOS)}")
        self.deal = game.deal(SCENARIOS, learner)
        self.sheet = game.ClassSheet()
        self.revealed: set = set()  # scenario ids this learner has revealed
        self.last: Optional[RunResult] = None
        self.results: dict = {}
        self.pending: Optional[dict] = None  # the last run of a hidden case, waiting for its reveal
        self._defaults: dict = {}
        self._run_limits: dict = {}  # the last run's limits (a hidden case's are drawn at its reveal)
        self._run_lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        build_widgets(self, game.prediction_options(CAUSES, CATALOGUE), _SHARING)
        self.learner.value = learner
        self.scenario.options = self._scenario_options()
        self.scenario.value = self.scenario.options[0][1] if scenario is None else (
            self.deal.case_of(scenario) if mystery else scenario)
        self.which.value = which
        self.scenario.observe(self._on_scenario, names="value")
        self.which.observe(self._on_scenario, names="value")
        self.learner.observe(self._on_learner, names="value")
        self.show_code.observe(lambda _change: self._render_code(), names="value")
        self.button.on_click(lambda _b: self.start())
        self.reveal_button.on_click(lambda _b: self.reveal())
        self.compare_button.on_click(lambda _b: self.start(compare=True))
        self.user_button.on_click(lambda _b: self.start(own=True))
        self.try_button.on_click(lambda _b: self.start(challenge=True))
        self.challenge.observe(lambda _c: self._render_challenge(), names="value")
        self.export_button.on_click(lambda _b: self._export_clicked())
        build_layout(self)
        self._on_scenario()
        self._render_score()

    def _scenario_options(self) -> list:
        if self.mystery:
            return [(case, case) for case in self.deal.cases]
        return [(f"{s.id}: {s.title}", s.id) for s in self.scenarios.values()]

    @property
    def current(self):
        """The scenario behind the chosen case (or the chosen scenario, outside mystery mode)."""
        value = self.scenario.value
        return self.scenarios[self.deal.scenario_of(value) if self.mystery else value]

    @property
    def case(self) -> str:
        """What the page calls the chosen scenario: its case name (mystery) or its id."""
        return self.scenario.value

    @property
    def hidden(self) -> bool:
        """True while the chosen case's identity must not reach the page."""
        return self.mystery and self.current.id not in self.revealed

    def _on_learner(self, _change=None) -> None:
        """A new name deals the cases again, until the first answer (then the deal stays); the export's
        default file name follows the name."""
        if os.path.basename(self.export_path.value.strip()).startswith("lab_answers"):
            self.export_path.value = game.export_name(self.learner.value)
        if self.sheet.answers or not self.mystery:
            return
        self.deal = game.deal(self.scenarios, self.learner.value)
        self._on_scenario()

    def unlock(self, scenario_id: str) -> None:
        """Mark a scenario revealed without playing it (an instructor's demo, a test): its limits and knobs
        load as at a reveal."""
        self.revealed.add(scenario_id)
        self._on_scenario()

    def offered_knobs(self) -> tuple:
        """The knobs the chosen scenario declares (the registry), in the lab's order."""
        return tuple(k for k in self.knob_widgets if k in self.current.knobs)

    def _on_scenario(self, _change=None) -> None:
        """Load the chosen scenario's own limits and its script's knob defaults into the widgets; a hidden
        case loads nothing (the limit widgets are on the Your code tab too) and shows the setup line every
        hidden case shows."""
        sc = self.current
        if self.hidden and self.which.value != "broken":
            self.which.value = "broken"  # observed: loads the broken version's values
            return
        if self.hidden:
            self._defaults = {}
            self.setup.value = html.escape(game.HIDDEN_SETUP)
            self._refresh()
            return
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
        self._defaults = self.settings()
        self.setup.value = html.escape(game.setup_text(opts.kwargs()))
        self._refresh()

    def _refresh(self) -> None:
        """Show or hide what depends on the case being revealed (the learner's values stay as set)."""
        hidden = self.hidden
        self.knob_box.children = [] if hidden else [self.knob_widgets[k] for k in self.offered_knobs()]
        self.which.disabled = self.compare_button.disabled = hidden
        self.reveal_button.disabled = not (hidden and self.pending and self.pending["case"] == self.case)
        self._render_code()
        self._render_challenge()

    def _script_view(self) -> tuple:
        """(name shown, text) of the chosen script: a hidden case shows its case file name only."""
        path = self.current.path(self.which.value)
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        shown = self.case.lower().replace(" ", "_") + ".py" if self.hidden else os.path.basename(path)
        return shown, text

    def _render_code(self) -> None:
        self.code.outputs = ()  # (clear_output() only works inside a cell's execution)
        if self.show_code.value:
            name, text = self._script_view()
            self.code.append_stdout(f"# {name}\n{text}")  # works headless too, unlike `with self.code: print()`

    def settings(self) -> dict:
        """Every offered knob's value as text (what a challenge compares with the case's defaults)."""
        out = {}
        for name in self.offered_knobs():
            value = self.knob_widgets[name].value
            out[name] = ("1" if value else "0") if isinstance(value, bool) else str(value).strip()
        return out

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
        base = self.current.options(which or self.which.value)
        kw = base.kwargs()
        if self.hidden:  # the case as it is: no widget holds its limits until the reveal
            return dict(kw, env={})
        kw.update(self._limits(self.offered_knobs()))
        kw["env"] = self.knob_env()
        return kw

    def _nofile(self) -> Optional[int]:
        nofile = self.nofile.value.strip()
        if nofile and not nofile.isdigit():
            raise IsolationError(f"Open files limit: {nofile!r} is not a whole number; give e.g. 128")
        return int(nofile) if nofile else None

    def _limits(self, names) -> dict:
        """The limit widgets among ``names`` as run_isolated keywords (read only when named)."""
        read = {"start_method": lambda: None if self.start_method.value.startswith("(") else self.start_method.value,
                "timeout": lambda: float(self.timeout.value), "stall": lambda: float(self.stall.value),
                "memory_budget": lambda: self.memory_budget.value.strip() or None,
                "shm_size": lambda: self.shm_size.value.strip() or None, "nofile": self._nofile}
        return {name: read[name]() for name in names if name in read}

    @property
    def busy(self) -> bool:
        return self._run_lock.locked()

    def _set_busy(self, busy: bool) -> None:
        for b in (self.button, self.user_button, self.try_button):
            b.disabled = busy
        self.compare_button.disabled = busy or self.hidden

    def _acquire(self) -> bool:
        """Take the run lock, or say in the status that a run is going (False)."""
        if not self._run_lock.acquire(blocking=False):
            self.status.value = _BUSY
            return False
        self._set_busy(True)
        return True

    def _release(self) -> None:
        self._run_lock.release()
        self._set_busy(False)

    def _guarded(self, fn):
        """Run ``fn`` unless another run is going (then one clear line in the status, and None)."""
        if not self._acquire():
            return None
        try:
            return fn()
        finally:
            self._release()

    def start(self, compare: bool = False, own: bool = False, challenge: bool = False) -> bool:
        """What the buttons do: the run goes in a background thread; False if one is already going."""
        if not self._acquire():
            return False
        job = self._run_own if own else self._run_compare if compare else \
            self._try_challenge if challenge else self._run
        self._thread = threading.Thread(target=self._job, args=(job,), daemon=True, name="labutils-lab-run")
        self._thread.start()
        return True

    def wait(self, timeout: Optional[float] = None) -> Optional[RunResult]:
        """Wait for the background run; returns the last result."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.last

    def _job(self, job) -> None:
        try:
            job()
        except Exception as exc:  # noqa: BLE001 - shown in the status line; the kernel must not see it
            self.status.value = _red(f"the lab failed: {exc!r}")
        finally:
            self._release()

    def run(self) -> Optional[RunResult]:
        """Run the chosen case (blocking): the chart follows it; a hidden case is revealed only once a
        prediction is recorded. Returns the RunResult (None on bad input or while another run goes)."""
        return self._guarded(self._run)

    def run_compare(self) -> dict:
        """Broken, then fixed, with the same knobs, overlaid on the chart; the diff and both cards."""
        return self._guarded(self._run_compare) or {}

    def run_own(self) -> Optional[RunResult]:
        """Run the pasted script (or the file named) isolated, with the same chart and card."""
        return self._guarded(self._run_own)

    def try_challenge(self) -> Optional[dict]:
        """Run the chosen challenge's case with the knobs as set, and score the attempt."""
        return self._guarded(self._try_challenge)

    def _isolated(self, title: str, overlay: bool = False, show_limits: bool = True, **kw) -> tuple:
        """One isolated run with the live chart following it: (result, chart snapshot). ``show_limits``
        False: no limit line on the chart (a hidden case's limits are drawn at its reveal)."""
        limits = {k: kw.get(k) for k in ("memory_budget", "nofile", "shm_size")}
        self._run_limits = limits
        rec = self.live.start(title, limits=limits if show_limits else {}, overlay=overlay)
        rec.private_shm = bool(kw.get("shm_size"))
        try:
            return run_isolated(on_sample=rec.on_sample, on_event=rec.on_event, **kw), rec
        finally:
            self.live.stop()

    def _clear(self) -> None:
        self.output.outputs = self.compare.outputs = self.printed.outputs = ()
        self.verdict.value = ""

    def _guess(self) -> Optional[dict]:
        """The learner's prediction as recorded now: a cause, numbers or both (None without any); bad numbers
        raise ValueError."""
        guess = {"predicted": self.prediction.value or "",
                 "predicted_batches": game.parse_number(self.guess_batches.value, "Batches delivered"),
                 "predicted_shm_mib": game.parse_number(self.guess_shm.value, "/dev/shm peak (MiB)")}
        return guess if any(v not in ("", None) for v in guess.values()) else None

    def _run(self) -> Optional[RunResult]:
        sc, which, case, hidden = self.current, self.which.value, self.case, self.hidden
        self._clear()
        try:
            guess = self._guess()
            opts = self.options()
            script = game.neutral_copy(sc.path(which), case) if hidden else sc.path(which)
            title = case if hidden else f"{case} ({which})"
            self.status.value = f"running {html.escape(title)}..."
            try:
                result, rec = self._isolated(title, show_limits=not hidden, file=script, **opts)
            finally:
                if hidden:
                    game.remove_copy(script)
        except (IsolationError, ValueError) as exc:
            self.status.value = _red(str(exc))
            return None
        self.last = result
        numbers = game.observed_numbers(result, rec.snapshot())
        self.pending = {"case": case, "scenario": sc.id, "result": result, "numbers": numbers, "seen": False}
        if hidden and not (guess or {}).get("predicted"):  # a hidden case is revealed only with a cause predicted
            tail = "\n".join(stderr_view(result)[0])  # the lab's runner frames left out
            self.printed.append_stdout(f"what {case} printed last (stderr):\n{tail or '(nothing)'}\n")
            self.pending["seen"] = True
            self.reveal_button.disabled = False
            self.status.value = (f"{case} ended after {result.wall_time:.1f} s: "
                                 f"{_OUTCOME_WORDS.get(result.outcome, result.outcome)}. Read what it printed, "
                                 "pick your prediction, then press <b>Reveal</b>.")
            return result
        self._reveal(guess)
        return result

    def reveal(self) -> bool:
        """Record the prediction for the last run of the chosen case and reveal it (False if not yet)."""
        p = self.pending
        if p is None or p["case"] != self.case or not self.prediction.value:
            self.status.value = "run the case first, then pick your prediction and press Reveal"
            return False
        try:
            guess = self._guess()
        except ValueError as exc:
            self.status.value = _red(str(exc))
            return False
        self._reveal(guess)
        return True

    def _reveal(self, guess: Optional[dict]) -> None:
        p, sc = self.pending, self.scenarios[self.pending["scenario"]]
        result = p["result"]
        scored = bool(guess and guess["predicted"]) and sc.id not in self.revealed
        numbers_only = not scored and guess is not None and sc.id in self.revealed and (
            guess["predicted_batches"] is not None or guess["predicted_shm_mib"] is not None)
        answer = game.Answer(learner=self.learner.value.strip(), case=p["case"], **(guess or {"predicted": ""}))
        answer.scenario, answer.diagnosed, answer.revealed = sc.id, result.diagnosis.cause, True
        answer.correct = guess is not None and guess["predicted"] == result.diagnosis.cause
        answer.observed_batches, answer.observed_shm_mib = p["numbers"]["batches"], p["numbers"]["shm_mib"]
        answer.notebook = sc.notebook
        game.score_numbers(answer)
        if scored:
            self.sheet.answers.append(answer)
            self.prediction.value = ""
        elif numbers_only:  # predicted against observed for this run's knobs, on the sheet apart from the game
            defaults = self._defaults
            answer.knobs = ", ".join(f"{k}={v}" for k, v in self.settings().items() if defaults.get(k) != v)
            answer.knobs = answer.knobs or "the case's own"
            self.sheet.numbers.append(answer)
        first_reveal = sc.id not in self.revealed
        self.revealed.add(sc.id)
        if first_reveal and self.mystery:  # now the case's limits may show: in the widgets and on the chart
            self._on_scenario()
            self.live.limits = dict(self._run_limits)
            self.live.draw(running=False)
        self.pending = None
        self.reveal_button.disabled = True
        note = ("" if scored else "<br><i>(numbers recorded on the Class sheet, predicted against observed)</i>"
                if numbers_only else "<br><i>(not scored: no prediction, or the case was already revealed)</i>")
        self.verdict.value = game.reveal_html(answer, sc, result.diagnosis) + note
        self.status.value = (f"{html.escape(p['case'])} ({html.escape(sc.id)}): <b>{result.outcome}</b>, cause "
                             f"<code>{html.escape(result.cause)}</code> (expected for the broken run: "
                             f"{html.escape(sc.expected)}) in {result.wall_time:.1f} s")
        self.output.append_display_data(Card(result))
        self._refresh()
        self._render_score()

    def _run_compare(self) -> dict:
        import ipywidgets as w

        sc = self.current
        if self.hidden:
            self.status.value = "reveal this case first: Broken vs fixed shows its answer"
            return {}
        self._clear()
        results = {}
        try:
            for i, which in enumerate(("broken", "fixed")):
                self.status.value = f"running {sc.id} ({which}) for the comparison..."
                results[which], _ = self._isolated(which, overlay=i > 0, file=sc.path(which), **self.options(which))
        except (IsolationError, ValueError) as exc:
            self.status.value = _red(str(exc))
            return results
        self.results, self.last = results, results["fixed"]
        cards = []
        for which, r in results.items():
            out = w.Output(layout=w.Layout(width="50%"))
            out.append_display_data(w.HTML(f"<b>{which}</b>: {r.outcome}, cause <code>{r.cause}</code>"))
            out.append_display_data(Card(r))
            cards.append(out)
        self.compare.append_display_data(w.HTML(script_diff_html(sc.path("broken"), sc.path("fixed"))))
        self.compare.append_display_data(w.HBox(cards))
        self.status.value = (f"{sc.id}: broken -> <code>{results['broken'].cause}</code>, "
                             f"fixed -> <b>{results['fixed'].outcome}</b>")
        return results

    def _run_own(self) -> Optional[RunResult]:
        self._clear()
        code, path = self.user_code.value, self.user_path.value.strip()
        try:
            if code.strip() and path:
                raise IsolationError("give either pasted code or a file path, not both: clear one of them")
            if not code.strip() and not path:
                raise IsolationError("paste a script into the box, or give the path of a .py file")
            if path and not os.path.isfile(path):
                raise IsolationError(f"File: {path!r} is not a file; give the path of a .py script")
            kw = self._limits(("start_method", "timeout", "memory_budget", "shm_size", "nofile"))
            kw.update({"file": path} if path else {"code": code})
            self.status.value = "running your code..."
            result, _ = self._isolated(os.path.basename(path) if path else "your code", **kw)
        except (IsolationError, ValueError) as exc:
            self.status.value = _red(str(exc))
            return None
        self.last = result
        self.status.value = f"your code: <b>{result.outcome}</b>, cause <code>{result.cause}</code>"
        self.verdict.value = (f"The diagnosis: <code>{html.escape(result.diagnosis.cause)}</code>. What decided it:"
                              + "".join(f"<li>{html.escape(str(e))}</li>" for e in result.diagnosis.evidence[:4]))
        self.output.append_display_data(Card(result))
        return result

    def _challenge_case(self, ch) -> str:
        return self.deal.case_of(ch.scenario) if self.mystery else ch.scenario

    def _render_challenge(self) -> None:
        ch = CHALLENGES.get(self.challenge.value)
        if ch is None or ch.scenario not in self.scenarios:
            self.challenge_text.value = ""
            return
        if self.mystery and ch.scenario not in self.revealed:  # neither the case nor the target: either names it
            self.challenge_text.value = _LOCKED
            return
        case = self._challenge_case(ch)
        play, lack = playable(ch, isolate.private_shm_support)
        lack_text = "" if not lack else f"<br>{_red(lack)}" if play is ch else (
            f"<br><i>The first target {html.escape(lack)}; so this machine plays the fallback target "
            "above instead.</i>")
        self.challenge_text.value = html.escape(play.describe(case)) + lack_text + (
            f"<br>Open {case} in the {self.tabs.titles[0]} tab, set the knobs, then press <b>Try</b>.")

    def _try_challenge(self) -> Optional[dict]:
        ch = CHALLENGES.get(self.challenge.value)
        if ch is None:
            self.status.value = "pick a challenge first"
            return None
        if self.mystery and ch.scenario not in self.revealed:
            self.status.value = _red(_LOCKED)
            return None
        case = self._challenge_case(ch)
        ch, lack = playable(ch, isolate.private_shm_support)
        lack = None if ch.peak_mib is not None else lack  # the fallback scores where the first target cannot
        if lack or self.current.id != ch.scenario:
            where = f"open {case} in the {self.tabs.titles[0]} tab (revealed) to try this challenge"
            self.status.value = _red(lack or where)
            return None
        self._clear()
        settings, defaults = self.settings(), dict(self._defaults)
        try:
            self.status.value = f"challenge on {html.escape(case)}: running..."
            opts = self.options("broken")
            if ch.peak_mib is not None:  # the measured ceiling: the machine's own /dev/shm
                opts["shm_size"] = None
            result, rec = self._isolated(f"{case}: challenge", file=self.current.path("broken"), **opts)
        except (IsolationError, ValueError) as exc:
            self.status.value = _red(str(exc))
            return None
        self.last = result
        peak = game.observed_numbers(result, rec.snapshot())["shm_mib"]
        if ch.peak_mib is not None and peak is not None:  # a sample may miss the peak: trying again cannot help
            peak = max([peak] + [a["shm_peak_mib"] for a in self.sheet.attempts if a["challenge"] == ch.id
                                 and a["knobs"] == settings and a.get("shm_peak_mib") is not None])
        attempt = score_attempt(ch, settings, defaults, result, self.learner.value.strip(), case, shm_peak_mib=peak)
        self.sheet.attempts.append(attempt)
        verdict = (f"counted, score {attempt['score']:g}" if attempt["counted"] and attempt["success"]
                   else f"not scored: {attempt['why']}")
        self.status.value = f"challenge on {html.escape(case)}: {result.outcome}; {html.escape(verdict)}"
        self._render_score()
        return attempt

    @property
    def answers(self) -> list:
        return self.sheet.answers

    @property
    def correct(self) -> int:
        return self.sheet.correct

    def _render_score(self) -> None:
        self.score.value = self.sheet.html()

    def export_answers(self, path: str) -> str:
        """Write the class sheet to ``path`` (``.json``: predictions, challenges, best; otherwise CSV)."""
        return self.sheet.export(path)

    def _export_clicked(self) -> None:
        try:
            where = self.export_answers(self.export_path.value.strip() or game.export_name(self.learner.value))
        except OSError as exc:
            self.status.value = _red(f"export failed: {exc}")
            return
        sheet = self.sheet
        self.status.value = (f"{len(sheet.answers)} predictions, {len(sheet.numbers)} numbers and "
                             f"{len(sheet.attempts)} challenge attempts written to <code>{html.escape(where)}</code>")


def lab(scenario: Optional[str] = None, which: str = "broken", mystery: bool = True, learner: str = ""):
    """Build the interactive lab and return its widget (display it, or leave it last in a cell)."""
    return LabUI(scenario, which, mystery=mystery, learner=learner).widget
