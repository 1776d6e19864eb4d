"""The lab in a real browser: JupyterLab on 127.0.0.1 with a token, Debian's chromium driven by Playwright.

The test opens a temporary copy of ``notebooks/09_interactive_lab.ipynb`` (its cells up to the lab: the
rest is prompts and nbval's rehearsal), runs all cells from JupyterLab's Run menu and types a learner's
name. A fair game first: it picks every case in turn (with "Show the script" ticked, so that the page
shows when the kernel has switched) and the page's text without the script (every tooltip and input
value included, the prediction's list of choices left out, the case's name blanked) must be the same for
every case: the setup line, the limit widgets, the status, the chart. Then it runs the case that is
``fd_limit`` in that learner's deal without a prediction. Until the reveal, the page's text must not
contain the cause id, the scenario's title or its script's name, nor the case's limit (on the setup line
or as a line on the chart), and the status must be the words every case gets with only its run time and
outcome; the run's own output must be there. Then it predicts the cause and a number of batches,
reveals, and reads the cause, the limit and the number's score in the reveal. Last, it runs a
loader of a few seconds from the "Your code" tab and counts the changes the page makes to the chart
(a MutationObserver on the batches panel): at least 4 a second. A screenshot is kept in ``tmp_path``
when it fails. It skips, with the reason, where chromium or Playwright is missing (CI installs both:
``.ci/run`` and requirements.txt).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "09_interactive_lab.ipynb")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = pytest.mark.timeout(240)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup_copy(dest: str) -> None:
    """The notebook's cells up to and including the one that shows the widget."""
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    end = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "ui.widget" in c.source)
    nb.cells = nb.cells[: end + 1]
    nbformat.write(nb, dest)


@pytest.fixture
def jupyter(tmp_path):
    """A JupyterLab server on a free port of 127.0.0.1, with a token; always stopped at the end."""
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")
    work = tmp_path / "work"
    work.mkdir()
    _setup_copy(str(work / "lab.ipynb"))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    for var, sub in (
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
        ("JUPYTERLAB_SETTINGS_DIR", "settings"),
    ):
        env[var] = str(tmp_path / sub)
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={work}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and CI runners often run as root
    log = open(tmp_path / "jupyter.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise RuntimeError("JupyterLab did not start: " + (tmp_path / "jupyter.log").read_text()[-2000:])
            time.sleep(0.3)
        yield {"base": base, "token": token, "tmp": tmp_path}
    finally:
        try:  # the server's own shutdown also shuts its kernels down (and their isolated runs)
            req = urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST")
            urllib.request.urlopen(req, timeout=5).close()
            proc.wait(timeout=20)
        except Exception:  # noqa: BLE001
            pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()


@pytest.fixture
def page(jupyter):
    """A headless chromium page; the browser is always closed."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (`apt-get install -y chromium`)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 1000})
            pg.set_default_timeout(60_000)
            yield pg
        finally:
            browser.close()


LEARNER = "browser test"
SLOW_LOADER = """import time
import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.zeros(1000)


if __name__ == "__main__":
    for batch in DataLoader(Slow(), batch_size=2, num_workers=2):
        pass
"""

# Everything on the page as text: the document's text (without the prediction's list of choices, which
# describes every cause by what it looks like) and every tooltip.
PAGE_TEXT = """() => {
  const body = document.body.cloneNode(true);
  body.querySelectorAll('.lab-prediction').forEach(e => e.remove());
  const titles = Array.from(document.querySelectorAll('[title]')).map(e => e.getAttribute('title'));
  const values = Array.from(document.querySelectorAll('input, textarea')).map(e => e.value);
  return body.textContent + '\\n' + titles.join('\\n') + '\\n' + values.join('\\n');
}"""

# Count the changes the page makes to the batches panel's line (the last figure of the chart).
WATCH_CHART = """() => {
  window.__chartChanges = [];
  const figs = document.querySelector('.lab-chart').children;  // the four figures, batches last
  const target = figs[figs.length - 1];
  new MutationObserver(records => {
    if (records.some(r => r.type === 'attributes' && r.attributeName === 'd')) {
      window.__chartChanges.push(performance.now());
    }
  }).observe(target, {subtree: true, attributes: true, attributeFilter: ['d']});
  return figs.length;
}"""


def _redraws(times_ms: list, gap_ms: float = 40.0) -> list:
    """One update from the kernel changes several paths of a figure (its line, its axes) in a burst of
    messages a few ms apart; the bursts are the redraws the learner sees."""
    out: list = []
    for t in times_ms:
        if not out or t - out[-1][-1] > gap_ms:
            out.append([t])
        else:
            out[-1].append(t)
    return [burst[0] for burst in out]


def _rate(times_ms: list) -> float:
    if len(times_ms) < 2 or times_ms[-1] <= times_ms[0]:
        return 0.0
    return (len(times_ms) - 1) / ((times_ms[-1] - times_ms[0]) / 1000)


def _giveaways(text: str, sc) -> list:
    found = [s for s in (sc.title, sc.broken, sc.fixed) if s in text]
    return found + ([sc.id] if re.search(rf"(?<![A-Za-z_]){re.escape(sc.id)}(?![A-Za-z_])", text) else [])


# The lab's own text (JupyterLab's status bar and toolbars change by themselves): the widget's text without
# the prediction's choices and the script (it is the case itself, shown on request), its tooltips, its values.
LAB_TEXT = """() => {
  const root = document.querySelector('.lab-root');
  const copy = root.cloneNode(true);
  copy.querySelectorAll('.lab-prediction, .lab-code').forEach(e => e.remove());
  const titles = Array.from(root.querySelectorAll('[title]')).map(e => e.getAttribute('title'));
  const values = Array.from(root.querySelectorAll('input, textarea')).map(e => e.value);
  return copy.textContent + '\\n' + titles.join('\\n') + '\\n' + values.join('\\n');
}"""


def _hidden_page_text(page, case: str, cases: list) -> str:
    """The lab's text with the case dropdown's list and the chosen case's name blanked."""
    text = page.evaluate(LAB_TEXT)
    return text.replace("".join(cases), "(the cases)").replace(case, "Case ?")


def _every_hidden_case_looks_the_same(page, cases: list) -> str:
    page.locator(".lm-TabBar-tabLabel", has_text="Cases").first.click()
    page.locator(".widget-checkbox", has_text="Show the script").locator("input").check()
    texts = {}
    for case in cases:
        page.locator(".lab-case select").select_option(label=case)
        page.locator(".lab-code", has_text=f"# {case.lower().replace(' ', '_')}.py").wait_for(timeout=30_000)
        texts[case] = _hidden_page_text(page, case, cases)
    page.locator(".widget-checkbox", has_text="Show the script").locator("input").uncheck()
    first = texts[cases[0]]
    differ = [c for c, t in texts.items() if t != first]
    if differ:
        import difflib

        diff = list(difflib.unified_diff(first.splitlines(), texts[differ[0]].splitlines(), lineterm="", n=0))
        raise AssertionError(f"these hidden cases show another page than {cases[0]}: {differ}; the first "
                             f"difference: {diff[:12]}")
    assert "they are shown at the reveal" in first, first[:500]
    return first


def _open_lab(page, jupyter) -> None:
    page.goto(f"{jupyter['base']}/lab/tree/lab.ipynb?token={jupyter['token']}")
    page.locator(".jp-Notebook").first.wait_for()
    accept = page.locator(".jp-Dialog button.jp-mod-accept")  # "Select Kernel", where JupyterLab asks
    try:
        accept.first.wait_for(timeout=15_000)
        accept.first.click()
    except Exception:  # noqa: BLE001 - no dialog: the notebook's kernel started by itself
        pass
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=90_000)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    page.locator("button.lab-run").wait_for(timeout=90_000)


def test_a_case_stays_hidden_in_the_browser_until_the_reveal_and_the_chart_moves(jupyter, page):
    from labutils.diagnosis.causes import CATALOGUE
    from labutils.lab.game import deal
    from labutils.scenarios import SCENARIOS

    sc = SCENARIOS["fd_limit"]
    dealt = deal(SCENARIOS, LEARNER)
    case, cases = dealt.case_of(sc.id), list(dealt.cases)
    shot = jupyter["tmp"] / "lab_failure.png"
    t0 = time.monotonic()
    try:
        _open_lab(page, jupyter)
        page.locator(".lab-learner input").fill(LEARNER)
        page.locator(".lab-learner input").press("Enter")
        _every_hidden_case_looks_the_same(page, cases)
        page.locator(".lab-case select").select_option(label=case)
        assert _giveaways(page.evaluate(PAGE_TEXT), sc) == [], "before the run"
        page.locator(".lab-user-code textarea").wait_for(state="attached")
        page.locator("button.lab-run").click()
        status = page.locator(".lab-status")
        seen: list = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = page.evaluate(PAGE_TEXT)
            seen += _giveaways(text, sc)
            if "ended after" in status.inner_text():
                break
            time.sleep(0.2)
        assert "ended after" in status.inner_text(), status.inner_text()
        assert seen == [] and _giveaways(page.evaluate(PAGE_TEXT), sc) == [], f"before the reveal: {seen}"
        hidden = page.evaluate(PAGE_TEXT)
        assert "open files limit" not in hidden and "128" not in hidden, "no limit of the case before the reveal"
        words = re.fullmatch(rf"{case} ended after [0-9.]+ s: (it failed|it finished|the lab stopped it at a limit)"
                             r"\. Read what it printed, pick your prediction, then press Reveal\.",
                             status.inner_text().strip())
        assert words, f"the status of a hidden run is the same words for every case: {status.inner_text()!r}"
        assert "Too many open files" in page.locator(".lab-printed").inner_text(), "the run's own output is shown"
        page.locator(".lab-prediction select").select_option(label=CATALOGUE["fd_limit"].title)
        page.locator(".lab-guess-batches input").fill("50")
        page.locator(".lab-guess-batches input").press("Enter")
        page.locator("button.lab-reveal-button").click()
        verdict = page.locator(".lab-verdict")
        verdict.locator(".lab-reveal").wait_for(timeout=30_000)
        reveal = verdict.inner_text()
        assert "fd_limit" in reveal and sc.title in reveal and "06_file_descriptors" in reveal, reveal
        assert "right" in reveal, reveal
        numbers = verdict.locator(".lab-numbers").inner_text()
        assert "batches delivered" in numbers and "50" in numbers and "close?" in numbers, numbers
        assert re.search(r"\b(yes|no)\b", numbers.split("batches delivered", 1)[1]), numbers
        page.locator(".lab-setup", has_text="open files limit: 128").wait_for(timeout=30_000)  # its limit, now
        page.locator(".lm-TabBar-tabLabel", has_text="Class").first.click()
        score = page.locator(".lab-score").inner_text()
        assert "1 of 1 predictions right" in score and "numbers close" in score, score
        # the chart: a loader that runs for a few seconds, from the Your code tab
        page.locator(".lm-TabBar-tabLabel", has_text="Your code").first.click()
        page.locator(".lab-user-code textarea").fill(SLOW_LOADER)
        assert page.evaluate(WATCH_CHART) == 4, "four bqplot figures"
        page.locator("button.lab-run-mine").click()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "your code:" not in status.inner_text():
            time.sleep(0.2)
        changes = page.evaluate("window.__chartChanges")
        redraws = _redraws(changes)
        rate = _rate(redraws)
        print(f"chart changes seen by the page: {len(changes)} path changes in {len(redraws)} redraws, "
              f"{rate:.1f} redraws a second (loaded machine)")
        assert "your code: ok" in status.inner_text(), status.inner_text()
        assert rate >= 4, redraws
        assert "finished" in page.locator(".lab-chart-caption").inner_text()
    except Exception:
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot of the failure: {shot}")
        raise
    finally:
        print(f"browser part took {time.monotonic() - t0:.1f} s")
