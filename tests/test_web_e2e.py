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

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gradio", reason="the web extra is not installed (pip install -e '.[web]')")
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is not installed (pip install playwright)")
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
def browser():
    with sync_api.sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield chromium
        chromium.close()


def open_page(browser, server: str, width: int, height: int):
    pg = browser.new_page(viewport={"width": width, "height": height})
    pg.set_default_timeout(TIMEOUT_MS)
    # the page's Content-Security-Policy (web/http.py) must not block anything the page uses:
    # Chromium reports each blocked load or inline script on the console
    pg.on("console", lambda msg: CSP_REPORTS.append(msg.text) if "Content Security Policy" in msg.text
          else None)
    pg.goto(server)
    pg.wait_for_selector("#tp-verdict-box")
    return pg


@pytest.fixture(scope="module")
def page(browser, server):
    pg = open_page(browser, server, 1400, 1000)
    yield pg
    pg.close()


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
    # back with QLoRA (its own event)
    page.wait_for_function("!document.querySelector('#tp-rank input').disabled")
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
    assert all(card in msg
               for card in ("v100-sxm2-16gb", "v100-pcie-16gb", "v100-sxm2-32gb", "v100-pcie-32gb"))
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


def test_every_element_id_is_used_once(page) -> None:
    """Each tab's output has an id of its own (a second element with one of the form's ids would make
    `#id` pick either); Gradio's empty ids are not ids."""
    for tab in ("Best config", "GPUs", "Deploy", "Export"):
        page.get_by_role("tab", name=tab).click()
    page.wait_for_selector("#tp-gpus-rank table", state="attached")
    twice = page.evaluate("""() => { const seen = {};
        document.querySelectorAll('[id]').forEach(e => { if (e.id) seen[e.id] = (seen[e.id] || 0) + 1; });
        return Object.keys(seen).filter(k => seen[k] > 1); }""")
    assert twice == []


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


# The best-config tab against `tuneplan fit --json` for the same setup. The setups: a 7B on a 16 GB card,
# where only offloading plans fit; a 7B on a 24 GB card; a 70B across two 80 GB cards; a 405B that fits
# nowhere in the candidate space of one 24 GB card.
FIT_SETUPS = [
    ("Qwen/Qwen2.5-7B-Instruct", "v100-sxm2-16gb", 1),
    ("meta-llama/Llama-2-7b-hf", "rtx-4090", 1),
    ("meta-llama/Llama-3.1-70B-Instruct", "a100-80gb-sxm4", 2),
    ("meta-llama/Llama-3.1-405B-Instruct", "rtx-4090", 1),
]
RECOMMENDED = re.compile(
    r"Recommended(?: \(tight[^)]*\))?: (?P<method>\S+) \((?P<strategy>[^)]+)\), "
    r"micro-batch (?P<micro_batch>\d+) "
    r"× accumulation (?P<grad_accum>\d+) × (?P<world_size>\d+) GPU\(s\) = (?P<global_batch>\d+) sequences "
    r"per step; device peak (?P<peak>[\d,.]+) GiB \(upper band (?P<high>[\d,.]+) GiB\)"
    r"(?:; (?P<tokens>[\d,]+) tokens/s)?")
TABLE_CELLS = """sel => Array.from(document.querySelectorAll(sel + ' tr')).slice(1)
    .map(tr => Array.from(tr.cells).map(td => td.innerText.trim()))"""


def in_gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:,.2f}"


def cli_fit(model: str, gpu: str, gpus: int, form: dict[str, str]) -> tuple[int, dict]:
    """`tuneplan fit` in its own process with the flags for what the form shows."""
    cmd = [sys.executable, "-m", "tuneplan", "fit", model, "--gpu", gpu, "--gpus", str(gpus),
           "--rank", form["rank"], "--seq", form["seq"], "--samples", form["samples"],
           "--epochs", form["epochs"], "--global-batch", form["global_batch"], "--prefer", form["prefer"],
           "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def choose(pg, selector: str, value: str) -> None:
    box = pg.locator(selector)
    box.click()
    box.fill(value)
    box.press("Enter")


def form_values(pg) -> dict[str, str]:
    """What the form shows for the fields `fit` reads besides model, card and GPUs."""
    got = {k: pg.input_value(f"#tp-{k} input") for k in ("rank", "seq", "samples", "epochs")}
    avg_tokens = pg.input_value("#tp-avg_tokens textarea, #tp-avg_tokens input")
    got["global_batch"] = pg.input_value("#tp-global-batch input")
    got["prefer"] = pg.input_value("#tp-prefer input")
    assert avg_tokens == ""  # empty: a sample fills the sequence, as with no --avg-tokens
    return got


def check_recommendation(pg, rc: int, rec: dict | None, gpus: int) -> None:
    """The recommendation shown is the CLI's: method, strategy, sizes, peak, tokens/s, command."""
    shown = pg.inner_text("#tp-fit-recommended")
    if rec is None:
        assert rc == 1 and "No method fits" in shown
        return
    assert rc == 0
    got = RECOMMENDED.search(shown)
    assert got is not None, shown
    assert got.group("method", "strategy") == (rec["method"], rec["strategy"])
    sizes = ("micro_batch", "grad_accum", "world_size", "global_batch")
    assert [int(got.group(k)) for k in sizes] == [rec[k] for k in sizes]
    assert got.group("peak", "high") == (in_gib(rec["device_peak_bytes"]),
                                         in_gib(rec["device_peak_high_bytes"]))
    assert got.group("tokens") == f"{rec['tokens_per_second']:,.0f}"
    # the command to run: model, card, method, batch, seq, accumulation and every switch
    assert pg.inner_text("#tp-fit-recommended code") == rec["command"]
    assert f"--seq {rec['setup']['seq']}" in rec["command"] and rec["world_size"] == gpus


def check_methods(pg, methods: list[dict]) -> None:
    """One row per method as the CLI has it, and tokens/s for each method that fits."""
    rows = pg.evaluate(TABLE_CELLS, "#tp-fit table.tp-fit")
    assert [r[:8] for r in rows] == [
        [m["method"], "tight" if m["tight"] else "yes" if m["fits"] else "no", m["strategy"] or "-",
         ", ".join(m["requires"]) or "-", str(m["micro_batch"] or "-"), str(m["grad_accum"] or "-"),
         in_gib(m["device_peak_bytes"]), in_gib(m["device_peak_high_bytes"])] for m in methods]
    shown = pg.inner_text("#tp-fit")
    for why in {msg for m in methods for msg in m["blocked_by"]}:
        assert f"cannot run: {why}" in shown  # the planner's words, as the CLI prints them
    fitting = [[m["method"], f"{m['tokens_per_second']:,.0f}"] for m in methods if m["fits"]]
    if fitting:
        assert [r[:2] for r in pg.evaluate(TABLE_CELLS, "#tp-fit table.tp-fit-limits")] == fitting


@pytest.mark.parametrize(("model", "gpu", "gpus"), FIT_SETUPS,
                         ids=[f"{m.split('/')[1]}-{g}x{n}" for m, g, n in FIT_SETUPS])
def test_best_config_tab_is_the_clis_fit(browser, server, model: str, gpu: str, gpus: int) -> None:
    pg = open_page(browser, server, 1280, 900)
    try:
        choose(pg, "#tp-model input", model)
        choose(pg, "#tp-gpu input", gpu)
        if gpus != 1:
            pg.fill("#tp-gpus input", str(gpus))
            pg.press("#tp-gpus input", "Enter")
        pg.wait_for_function("m => document.querySelector('#tp-verdict-box').innerText.includes(m)",
                             arg=model)
        pg.get_by_role("tab", name="Best config").click()
        pg.wait_for_selector("#tp-fit #tp-fit-recommended")
        rc, want = cli_fit(model, gpu, gpus, form_values(pg))
        check_recommendation(pg, rc, want["recommended"], gpus)
        check_methods(pg, want["methods"])
        assert_tables_fit(pg, "#tp-fit")
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / f"web-fit-{model.split('/')[1]}-{gpu}-x{gpus}.png"
        pg.locator("#tp-fit").screenshot(path=str(shot))
    finally:
        pg.close()


def assert_tables_fit(pg, container: str) -> None:
    """No table under ``container`` reaches past its box or the window: the page does not scroll
    sideways, and every table is at most as wide as the block that holds it."""
    sizes = pg.evaluate("""sel => Array.from(document.querySelectorAll(sel + ' table')).map(t => ({
        table: t.scrollWidth, box: t.parentElement.clientWidth,
        right: t.getBoundingClientRect().right, window: document.documentElement.clientWidth}))""", container)
    assert sizes
    for s in sizes:
        assert s["table"] <= s["box"] and s["right"] <= s["window"], s
    assert pg.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")


def test_the_security_policy_blocks_nothing_the_page_uses(page) -> None:
    """Last in the file: every step above ran under the policy (``web/http.py``) without one report."""
    assert page.evaluate("document.querySelectorAll('#tp-chart-svg rect.tp-seg').length") > 3
    assert CSP_REPORTS == []

