"""The README's picture of the live lab: ``python tests/tools/lab_picture.py [--out notebooks/img/lab.png]``.

Starts JupyterLab on 127.0.0.1 with a token (the browser test's server, ``tests/test_lab_browser.py``), opens
notebook 09's lab in Debian's chromium through Playwright, deals the cases to a learner, runs the case that
is ``oom_killed`` in that deal and photographs the lab while the run goes: the last frame before it ends,
the cause still hidden as before a reveal. The PNG is cut to the widget, scaled to 900 px wide and reduced
to 64 colours, so it stays small. Needs ``/usr/bin/chromium`` (``apt-get install -y chromium``) and
``playwright`` (requirements.txt).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import test_lab_browser as browser  # noqa: E402  (its server, its chromium flags, its way into the lab)

LEARNER = "readme picture"
CASE = "oom_killed"
WIDTH, COLOURS = 900, 64


def _server(tmp: Path):
    """The browser test's JupyterLab fixture as a plain generator (its setup, then its teardown)."""
    fixture = browser.jupyter
    make = getattr(fixture, "_get_wrapped_function", None)
    return (make() if make else fixture.__wrapped__)(tmp)


def _small_png(raw: bytes) -> bytes:
    from PIL import Image

    img = Image.open(io.BytesIO(raw)).convert("RGB")
    if img.width > WIDTH:
        img = img.resize((WIDTH, round(img.height * WIDTH / img.width)), Image.LANCZOS)
    out = io.BytesIO()
    img.quantize(colors=COLOURS, method=Image.MEDIANCUT).save(out, format="PNG", optimize=True)
    return out.getvalue()


def photograph(page, jupyter) -> bytes:
    """Run the learner's ``oom_killed`` case in the lab; the last screenshot of the widget taken mid-run."""
    from labutils.lab.game import deal
    from labutils.scenarios import SCENARIOS

    browser._open_lab(page, jupyter)
    page.locator(".lab-learner input").fill(LEARNER)
    page.locator(".lab-learner input").press("Enter")
    page.locator(".lab-case select").select_option(label=deal(SCENARIOS, LEARNER).case_of(CASE))
    _dismiss_news(page)
    page.locator("button.lab-run").click()
    status, root = page.locator(".lab-status"), page.locator(".lab-root")
    last, deadline = None, time.monotonic() + 150
    while time.monotonic() < deadline:
        text = status.inner_text()
        if "ended after" in text:
            break
        if "starting" not in page.locator(".lab-chart-caption").inner_text():  # the chart has a line
            last = root.screenshot()
        time.sleep(0.3)
    else:
        raise RuntimeError(f"the case did not end within 150 s: {status.inner_text()}")
    if last is None:  # too quick for a frame mid-run: the chart as the run ended (cause still hidden)
        print("lab_picture: the run ended before a frame mid-run; the picture shows it as it ended")
        last = root.screenshot()
    return last


def _dismiss_news(page) -> None:
    """JupyterLab's "notified about news?" toast would cover the chart: answer No where it shows."""
    try:
        page.locator(".jp-toast-button", has_text="No").first.click(timeout=3_000)
    except Exception:  # noqa: BLE001 - no toast on this JupyterLab
        pass


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/tools/lab_picture.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "notebooks" / "img" / "lab.png"))
    args = parser.parse_args(argv)
    if not os.path.exists(browser.CHROMIUM):
        print(f"lab_picture: {browser.CHROMIUM} is absent: apt-get install -y chromium", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="lab-picture-") as tmp:
        server = _server(Path(tmp))
        jupyter = next(server)
        try:
            with sync_playwright() as pw:
                chromium = pw.chromium.launch(executable_path=browser.CHROMIUM, args=browser.CHROMIUM_ARGS)
                try:
                    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
                    page.set_default_timeout(60_000)
                    raw = photograph(page, jupyter)
                finally:
                    chromium.close()
        finally:
            server.close()  # the fixture's teardown: the server and its kernels stop
    png = _small_png(raw)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_bytes(png)
    print(f"{os.path.relpath(args.out, ROOT)}: {len(png) / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
