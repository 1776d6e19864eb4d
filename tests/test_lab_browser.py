"""The lab in a real browser: JupyterLab on 127.0.0.1 with a token, Debian's chromium driven by Playwright.

The test opens a temporary copy of ``notebooks/09_interactive_lab.ipynb`` (its setup cells only: the rest
of the notebook is nbval's test and would add half a minute), runs all cells from JupyterLab's Run menu,
turns a knob of the lab widget (the sharing strategy of ``fd_limit``), presses Run, and checks that the
chart changes between two moments while the run goes and that the diagnosis card appears with the
cause the knob produces. A screenshot is kept in ``tmp_path`` when it fails. It skips, with the reason,
where chromium or Playwright is missing (CI installs both: ``.ci/run`` and requirements.txt).
"""

from __future__ import annotations

import os
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


def test_knob_run_live_chart_and_card_in_a_real_browser(jupyter, page):
    shot = jupyter["tmp"] / "lab_failure.png"
    t0 = time.monotonic()
    try:
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
        run = page.locator("button.lab-run")
        run.wait_for(timeout=90_000)
        # the knob: fd_limit (broken) with the file_system sharing strategy
        page.locator(".lab-knob-sharing_strategy select").select_option("file_system")
        run.click()
        status, chart = page.locator(".lab-status"), page.locator(".lab-chart")
        seen_running: list = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = status.inner_text()
            src = chart.get_attribute("src") if chart.count() else None
            if "running" in text and src and src not in seen_running:
                seen_running.append(src)
            if "fd_limit (broken):" in text:
                break
            time.sleep(0.15)
        status_text = status.inner_text()
        card = page.locator(".lab-card").inner_text()
        assert len(seen_running) >= 2, f"the chart did not change while the run went: {seen_running}"
        assert "fd_limit (broken): ok" in status_text, status_text
        assert "cause: ok" in card, card
        assert "finished" in page.locator(".lab-chart-caption").inner_text()
    except Exception:
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot of the failure: {shot}")
        raise
    finally:
        print(f"browser part took {time.monotonic() - t0:.1f} s")
