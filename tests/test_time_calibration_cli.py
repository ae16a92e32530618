"""`calibration add` and `measure --calibrate` take the machine's time options (--link, --inter-node-gbs),
store them with the measurement, fit the step against them, and `calibration list` shows them."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from typer.testing import CliRunner

from tuneplan.api import estimate
from tuneplan.cli.app import app
from tuneplan.estimator.throughput import RuntimeOptions

MODEL = "meta-llama/Llama-2-7b-hf"
# two RTX 3090s under FSDP (Answer.AI's fsdp_qlora runs): the gradients cross the link between the cards, so
# the link the machine is described with moves the prediction
SETUP_FLAGS = ["--framework", "fsdp-qlora", "--method", "lora", "--gpus", "2", "--fsdp", "--seq", "2048",
               "--batch", "1"]
SETUP = {"framework": "fsdp-qlora", "method": "lora", "gpus": 2, "fsdp": True, "seq": 2048, "batch": 1}


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEPLAN_CONFIG_DIR", str(tmp_path))
    return tmp_path / "calibration.json"


def _predicted(link: str | None) -> float:
    """The uncalibrated step on the card with ``link`` stated (None: the catalog's link)."""
    opts = RuntimeOptions(peer_link=link) if link else None
    return estimate(MODEL, gpu="rtx-3090", time_options=opts, **SETUP).extras["sections"]["time"][
        "step_seconds"]


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), terminal_width=200)


def test_add_with_a_stated_link_fits_against_that_link(store) -> None:
    """A step given exactly as predicted on the stated PCIe 3.0 x8 board is stored with the link and leaves
    every factor at 1; the catalog's PCIe 4.0 x16 predicts a shorter step (a quarter of the lanes' rate
    there), so fitted against it the same seconds would have read as a slower link."""
    on_board, on_catalog = _predicted("pcie3x8"), _predicted(None)
    assert on_board > on_catalog
    res = _cli("calibration", "add", MODEL, "--gpu", "rtx-3090", *SETUP_FLAGS, "--link", "pcie3x8",
               "--step-seconds", repr(on_board), "--json")
    assert res.exit_code == 0, res.output
    m = json.loads(res.output)
    assert m["time_options"] == {"peer_link": "pcie3x8"}
    assert m["predicted_step_seconds"] == pytest.approx(on_board)
    stored = json.loads(store.read_text())["entries"]["rtx-3090|fsdp-qlora"]
    assert stored["measurements"][0]["time_options"] == {"peer_link": "pcie3x8"}
    assert all(v == pytest.approx(1.0, abs=1e-3) for v in stored["factors"].values())
    listed = _cli("calibration", "list")
    assert listed.exit_code == 0 and "(given; link pcie3x8)" in listed.output
    js = json.loads(_cli("calibration", "list", "--json").output)
    assert js["entries"][0]["measurements"][0]["time_options"] == {"peer_link": "pcie3x8"}


def test_add_without_a_link_keeps_the_catalogs(store) -> None:
    t = _predicted(None)
    res = _cli("calibration", "add", MODEL, "--gpu", "rtx-3090", *SETUP_FLAGS, "--step-seconds", repr(t),
               "--json")
    assert res.exit_code == 0, res.output
    m = json.loads(res.output)
    assert m["time_options"] == {} and m["predicted_step_seconds"] == pytest.approx(t)
    assert "(given)" in _cli("calibration", "list").output


@pytest.mark.parametrize(("flag", "value", "accepted"), [
    ("--link", "pcie9", "pcie<gen>x<lanes>"),
    ("--inter-node-gbs", "0", "GB/s per GPU > 0"),
])
def test_bad_machine_options_exit_2_naming_the_flag(store, flag: str, value: str, accepted: str) -> None:
    """Through the installed command line (its error boundary turns the refusal into exit 2), before any
    step is stored or run."""
    for args in (["calibration", "add", MODEL, "--gpu", "rtx-3090", *SETUP_FLAGS, "--step-seconds", "6"],
                 ["measure", MODEL, "--calibrate", "--device", "cpu", "--steps", "2"]):
        res = subprocess.run([sys.executable, "-m", "tuneplan", *args, flag, value], capture_output=True,
                             text=True)
        assert res.returncode == 2, res.stderr
        assert flag in res.stderr and accepted in res.stderr and "Traceback" not in res.stderr
        assert not store.exists()


def test_measure_calibrate_stores_the_stated_link(store, monkeypatch) -> None:
    """The training run itself is replaced by its result (a CUDA step on an RTX 3090 at the seconds the
    stated board predicts); the flags, the calibration and the store are the command's own."""
    import tuneplan.measure

    t = _predicted("pcie3x8")

    def measured(model: str, **kw: Any) -> dict[str, Any]:
        fields = {k: v for k, v in kw.items() if k not in ("steps", "device", "weights", "record")}
        est = estimate(model, timing=False, **fields)
        return {"measured": {"outcome": "measured", "memory_kind": "cuda", "step_seconds": [2 * t, t, t],
                             "device_name": "NVIDIA GeForce RTX 3090"},
                "estimate": est.to_dict()}

    monkeypatch.setattr(tuneplan.measure, "measure", measured)
    res = _cli("measure", MODEL, *SETUP_FLAGS, "--calibrate", "--link", "pcie3x8", "--json")
    assert res.exit_code == 0, res.output
    cal = json.loads(res.output)["calibration"]
    assert cal["time_options"] == {"peer_link": "pcie3x8"} and cal["source"] == "tuneplan measure"
    assert cal["measured_step_seconds"] == pytest.approx(t)  # the median of the timed steps 2..3
    assert cal["predicted_step_seconds"] == pytest.approx(t)
    stored = json.loads(store.read_text())["entries"]["rtx-3090|fsdp-qlora"]
    assert all(v == pytest.approx(1.0, abs=1e-3) for v in stored["factors"].values())


def test_measure_without_calibrate_says_the_link_is_unused(store) -> None:
    """--steps 0 is refused before any model is built; the warning comes first."""
    res = subprocess.run([sys.executable, "-m", "tuneplan", "measure", MODEL, "--link", "pcie3x8",
                          "--steps", "0"], capture_output=True, text=True)
    said = " ".join(res.stderr.split())  # the console wraps at its width
    assert res.returncode == 2 and "--steps" in said
    assert "--link and --inter-node-gbs describe the machine for --calibrate; ignored" in said
    assert not store.exists()
