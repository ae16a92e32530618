"""The page in a real browser: headless Chromium (Debian's package) driven by Playwright.

It loads the page served on loopback, checks the first verdict and chart, changes a field (method
QLoRA -> full), and checks that both the verdict and the chart followed without a submit; then it
types a bad value and checks that a message appears next to the field and that the server still
answers afterwards; then it opens the planner tab and builds recipe files to download. Screenshots
land in artifacts/web.png (the first screen) and artifacts/web-full.png (the whole page).

Runs where ``.ci/run`` installed gradio, playwright (Python package only) and ``apt-get install
chromium``; skipped, saying which, only when one of the three is missing.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

pytest.importorskip("gradio", reason="the web extra is not installed (pip install -e '.[web]')")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium (apt-get install chromium)")

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
TIMEOUT_MS = 60_000  # a page load takes 1-3 s here, 30 s seen on a busy shared machine; this bounds a hang


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from tuneplan.web import launch

    port = free_port()
    demo = launch("127.0.0.1", port, block=False, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@pytest.fixture(scope="module")
def page(server):
    with sync_api.sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.set_default_timeout(TIMEOUT_MS)
        # the page's Content-Security-Policy (web/http.py) must not block anything the page uses:
        # Chromium reports each blocked load or inline script on the console
        pg.on("console", lambda msg: CSP_REPORTS.append(msg.text) if "Content Security Policy" in msg.text
              else None)
        pg.goto(server)
        pg.wait_for_selector("#tp-verdict-box")
        yield pg
        browser.close()


CSP_REPORTS: list[str] = []


def verdict(pg) -> str:
    return pg.get_attribute("#tp-verdict-box", "data-verdict")


def peak(pg) -> str:
    return pg.get_attribute("#tp-chart-svg", "data-device-peak-bytes")


def test_changing_a_field_updates_verdict_and_chart(page) -> None:
    assert verdict(page) == "FITS"  # Qwen2.5-7B QLoRA r=16 on an RTX 4090, the form's default
    before = peak(page)
    assert page.locator("#tp-chart-svg rect.tp-seg").count() > 3
    bar_before = page.locator("#tp-chart-svg").inner_html()
    page.locator("#tp-method").get_by_text("full", exact=True).click()
    page.wait_for_function("document.querySelector('#tp-verdict-box').dataset.verdict === 'DOES NOT FIT'")
    assert peak(page) != before
    assert int(peak(page)) > int(before)
    assert page.locator("#tp-chart-svg").inner_html() != bar_before  # the drawing itself changed
    assert "short by" in page.inner_text("#tp-verdict-box")
    page.wait_for_function("document.querySelector('#tp-rank input').disabled")  # no LoRA rank for full FT
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#tp-method").get_by_text("qlora", exact=True).click()
    page.wait_for_function("document.querySelector('#tp-verdict-box').dataset.verdict === 'FITS'")
    assert peak(page) == before
    page.wait_for_function("!document.querySelector('#tp-rank input').disabled")  # back with QLoRA (own event)
    page.screenshot(path=str(ARTIFACTS / "web.png"))  # the README's picture (docs/img/web.png is a copy)
    page.screenshot(path=str(ARTIFACTS / "web-full.png"), full_page=True)


def test_bad_value_shows_a_message_and_the_server_keeps_serving(page) -> None:
    page.fill("#tp-rank input", "0")
    page.wait_for_selector("#tp-setup-msg .tp-error")
    assert "rank" in page.inner_text("#tp-setup-msg")
    assert verdict(page) == "INPUT ERROR"
    page.fill("#tp-rank input", "64")
    page.wait_for_function("document.querySelector('#tp-verdict-box').dataset.verdict === 'FITS'")
    assert page.locator("#tp-setup-msg .tp-error").count() == 0
    assert "r=64" in page.inner_text("#tp-verdict-box")


def test_typing_a_bare_card_name_is_refused_as_on_the_cli(page) -> None:
    """Typing "v100" and Enter in the card picker picks the model's own entry (listed before the cards),
    which the core refuses listing the four V100s, as `--gpu v100` does; then a card id works again."""
    box = page.locator("#tp-gpu input")
    box.click()
    box.fill("v100")
    box.press("Enter")
    page.wait_for_selector("#tp-hardware-msg .tp-error")
    msg = page.inner_text("#tp-hardware-msg")
    assert all(card in msg for card in ("v100-sxm2-16gb", "v100-pcie-16gb", "v100-sxm2-32gb", "v100-pcie-32gb"))
    box.click()
    box.fill("rtx-4090")
    box.press("Enter")
    page.wait_for_function("document.querySelector('#tp-verdict-box').dataset.verdict === 'FITS'")
    assert page.locator("#tp-hardware-msg .tp-error").count() == 0


def test_fit_tab_shows_the_planners_recommendation(page) -> None:
    page.get_by_role("tab", name="Best config").click()
    page.wait_for_selector("#tp-fit #tp-fit-recommended")
    assert "Recommended" in page.inner_text("#tp-fit")


def test_export_tab_offers_the_recipe_files_for_download(page) -> None:
    page.get_by_role("tab", name="Export").click()
    page.locator("#tp-export-btn").click()
    page.wait_for_selector("#tp-export-msg .tp-note")
    link = page.locator("#tp-export-files a[download='train.py']")
    link.wait_for()
    href = link.get_attribute("href") or ""
    assert href.endswith("/train.py")
    got = page.request.get(href)  # the download itself, as the browser would fetch it
    assert got.ok and "import" in got.text()
    # written in this browser session's own folder, inside the server process's own export folder
    from tuneplan.web import exports

    sessions = [d for d in exports.made() if d.name.startswith("session-")]
    assert len(sessions) == 1 and sessions[0].parent == exports.export_root()
    assert list(sessions[0].glob("recipe-*/train.py"))


def test_an_uploaded_config_reaches_the_verdict(page) -> None:
    """The upload arrives as bytes (never a server path) and its model is the one estimated; runs last."""
    import json

    from tests.conftest import TINY_LLAMA

    cfg = json.dumps({**TINY_LLAMA, "_name_or_path": "uploaded-tiny-llama"}).encode()
    page.get_by_text("...or paste / upload a config.json").click()
    with page.expect_file_chooser() as chooser:
        page.locator("#tp-upload").click()
    chooser.value.set_files(files=[{"name": "config.json", "mimeType": "application/json", "buffer": cfg}])
    page.wait_for_function("document.querySelector('#tp-verdict-box').innerText.includes('uploaded-tiny-llama')")
    assert page.locator("#tp-model-msg .tp-error").count() == 0


def test_the_security_policy_blocks_nothing_the_page_uses(page) -> None:
    """Last in the file: every step above ran under the policy (``web/http.py``) without one report."""
    assert page.evaluate("document.querySelectorAll('#tp-chart-svg rect.tp-seg').length") > 3
    assert CSP_REPORTS == []

