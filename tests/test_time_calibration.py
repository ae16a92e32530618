"""Learning from measured steps (per-mechanism factors) and the time band, against hand derivations."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tuneplan.api import estimate
from tuneplan.errors import TuneplanError
from tuneplan.estimator.step_calibration import MEASURED_STEP_SPREAD, fit_corrections, forget
from tuneplan.estimator.throughput import RuntimeOptions
from tuneplan.estimator.time_band import step_band

# Answer.AI, benchmarks_03_2024.md (fsdp_qlora): Llama-2 7B LoRA, FSDP on two RTX 3090, context 2048,
# 1,024 dummy samples; seconds over the training loop. Micro-batches per rank = 1024 / 2 / batch (rounded
# up after the cut to a multiple of the batch): batch 4 -> 128, batch 6 -> ceil(510 / 6) = 86.
RECORDED_B4 = 1366 / 128
RECORDED_B6 = 1199 / 86
RECORDED_B1 = 3090 / 512  # batch 1: 512 micro-batches per rank
SETUP = {"framework": "fsdp-qlora", "method": "lora", "gpus": 2, "fsdp": True, "seq": 2048,
         "gradient_checkpointing": True}
BOARD = RuntimeOptions(peer_link="pcie3x8")  # the post's "older motherboard" with "slow PCI lanes"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEPLAN_CONFIG_DIR", str(tmp_path))
    return tmp_path / "calibration.json"


def _step(batch: int, options: RuntimeOptions | None = None) -> dict:
    est = estimate("meta-llama/Llama-2-7b-hf", gpu="rtx-3090", batch=batch, time_options=options, **SETUP)
    return est.extras["sections"]["time"]


def test_fit_is_stationary_where_derived() -> None:
    # Step = sum p_m k_m; objective sum (x_m / w_m)^2 + ((T^ - T) / (eps T))^2 with x = ln k and the width
    # in ln k w_m = ln(1 + s_m) (the band holds a part between p / (1 + s) and p (1 + s)). Setting its
    # derivative in x_m to 0: x_m / w_m^2 = -(T^ - T) / (eps T)^2 * p_m e^x_m, so x_m / (w_m^2 p_m e^x_m) is
    # the same number, (T - T^) / (eps T)^2 > 0, for every mechanism.
    p = {"compute": 2.0, "memory_bound": 1.0, "overhead": 0.5}
    s = {"compute": 0.2, "memory_bound": 0.25, "overhead": 0.6}
    t = 4.2  # 20 % above the predicted 3.5

    def f(k: dict[str, float]) -> float:
        return sum(v * k.get(m, 1.0) for m, v in p.items())

    k = fit_corrections([(f, t)], s)
    x = {m: math.log(v) for m, v in k.items()}
    lam = (t - f(k)) / (MEASURED_STEP_SPREAD * t) ** 2
    assert lam > 0 and all(v > 0 for v in x.values())
    for m in p:
        assert x[m] / (math.log1p(s[m]) ** 2 * p[m] * k[m]) == pytest.approx(lam, rel=1e-3)
    assert f(k) == pytest.approx(t, rel=0.01)  # the prior leaves under 1 % of the difference here


def test_one_batch_moves_the_prediction_at_another(store) -> None:
    """Recorded at batch 4 on the post's board (``--link pcie3x8``), the prediction at batch 1 moves toward
    the step recorded there.

    By hand: the batch-4 step ran faster than predicted, so every fitted factor is <= 1 and, the step time
    growing with every factor, the other predictions can only fall; both were above their recordings. The
    calibrated batch-4 step reproduces the recording (within the spread the fit allows for a measured
    step)."""
    from tuneplan.measure.calibration import record_step

    before = {b: _step(b, BOARD) for b in (1, 4)}
    assert before[1]["step_seconds"] > RECORDED_B1 and before[4]["step_seconds"] > RECORDED_B4
    est = estimate("meta-llama/Llama-2-7b-hf", gpu="rtx-3090", batch=4, timing=False, **SETUP)
    record_step(est.run, est.gpu, RECORDED_B4, "test", options=BOARD)
    after = {b: _step(b, BOARD) for b in (1, 4)}
    assert after[4]["calibration"]["label"] == "calibrated on this machine"
    assert all(v <= 1.0 for v in after[4]["calibration"]["factors"].values())
    assert after[4]["step_seconds"] == pytest.approx(RECORDED_B4, rel=MEASURED_STEP_SPREAD)
    assert after[1]["uncalibrated_step_seconds"] == pytest.approx(before[1]["step_seconds"])
    assert after[1]["step_seconds"] < before[1]["step_seconds"]
    assert abs(after[1]["step_seconds"] - RECORDED_B1) < abs(before[1]["step_seconds"] - RECORDED_B1)


def test_batch_6_from_batch_4_lands_on_its_recording(store) -> None:
    """The recordings grow 1.31x from batch 4 to 6 (13.9 / 10.7 s), less than the 1.5x of the work: part of
    the step does not grow with the batch. Under fsdp_qlora's rate limiter that part is the gathers that
    wait for the compute (both all-gathers of every unit, per micro-batch, whatever its size), so the
    factors fitted at batch 4 carry to batch 6: its prediction falls onto its recording."""
    from tuneplan.measure.calibration import record_step

    before = _step(6, BOARD)["step_seconds"]
    est = estimate("meta-llama/Llama-2-7b-hf", gpu="rtx-3090", batch=4, timing=False, **SETUP)
    record_step(est.run, est.gpu, RECORDED_B4, "test", options=BOARD)
    after = _step(6, BOARD)["step_seconds"]
    assert after < before
    assert after == pytest.approx(RECORDED_B6, rel=MEASURED_STEP_SPREAD)


def test_the_fit_predicts_a_step_as_its_machine_was_described(store) -> None:
    """A step recorded with a stated link is fitted against the prediction on that link, the one the
    calibrated estimates (made with the same link) correct: recorded exactly as predicted on the post's
    PCIe 3.0 x8 board, the step leaves every factor at 1. Fitted against the catalog's PCIe 4.0 x16 (four
    times the lanes' rate) instead, the same seconds would read as a link several times slower."""
    from tuneplan.measure.calibration import record_step

    t = _step(1, BOARD)["step_seconds"]
    est = estimate("meta-llama/Llama-2-7b-hf", gpu="rtx-3090", batch=1, timing=False, **SETUP)
    m = record_step(est.run, est.gpu, t, "test", options=BOARD)
    assert m["time_options"] == {"peer_link": "pcie3x8"}
    assert m["predicted_step_seconds"] == pytest.approx(t)
    factors = _step(1, BOARD)["calibration"]["factors"]
    assert all(v == pytest.approx(1.0, abs=1e-3) for v in factors.values())


def test_store_never_written_through_a_link(store, tmp_path) -> None:
    from tuneplan.measure.calibration import list_entries, record_step, remove_entries

    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    os.symlink(target, store)
    est = estimate("Qwen/Qwen2.5-0.5B", gpu="rtx-4090", timing=False)
    with pytest.raises(TuneplanError) as err:
        record_step(est.run, est.gpu, 0.2, "test")
    assert err.value.field == "calibration" and target.read_text() == "{}"
    os.unlink(store)
    record_step(est.run, est.gpu, 0.2, "test")
    assert [r["card"] for r in list_entries()] == ["rtx-4090"]
    assert remove_entries("rtx-4090") == ["rtx-4090|hf"] and list_entries() == []
    store.write_text("not json")  # a damaged store never stops an estimate
    forget()  # written behind the store's back: read it again now
    assert estimate("Qwen/Qwen2.5-0.5B", gpu="rtx-4090").extras["sections"]["time"].get("calibration") is None


def test_band_is_each_part_at_its_ends() -> None:
    # two parts: 1 s at width 0.2 and 2 s at width 1.0 -> low 1/1.2 + 2/2, high 1.2 + 4
    assert step_band({"compute": 1.0, "communication": 2.0}, {"compute": 0.2, "communication": 1.0}) == (
        pytest.approx(1 / 1.2 + 1.0), pytest.approx(5.2))
    t = _step(4)
    b = t["band"]
    assert b["step_seconds_low"] < t["step_seconds"] < b["step_seconds_high"]
    assert b["widths"]["communication"] == 2.0  # a PCIe link the user did not state


def test_estimate_prints_the_band(store) -> None:
    args = [sys.executable, "-m", "tuneplan", "estimate", "Qwen/Qwen2.5-0.5B", "--gpu", "4090",
            "--samples", "100"]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0 and "plan for" in out.stdout
    js = json.loads(subprocess.run(args + ["--json"], capture_output=True, text=True).stdout)
    band = js["time"]["band"]
    assert band["total_hours_low"] < js["time"]["total_hours"] < band["total_hours_high"]


def test_catalog_cards_say_how_well_their_time_is_known() -> None:
    for gpu, known in (("910b", "proxy"), ("rtx5880", "proxy"), ("a100-80gb-sxm4", "measured"),
                       ("rtx-4090", "measured"), ("rtx-3090", "measured"), ("rtx-a6000", "spec-derived")):
        t = estimate("Qwen/Qwen2.5-0.5B", gpu=gpu).extras["sections"]["time"]
        assert t["card_throughput_known"] == known and t["step_seconds"] > 0


def test_the_4090_gemm_fraction_is_the_published_measurement() -> None:
    # xytpai/PeakGemm README: a bf16 WMMA GEMM (fp32 accumulators), m = n = k = 8192, 163.5 TFLOPS on an
    # RTX 4090 whose dense bf16 peak (fp32 accumulate, Ada whitepaper) is 165.2 TFLOPS
    from tuneplan.catalog.accelerators import resolve_accelerator
    from tuneplan.estimator.card_rates import GEMM_EFFICIENCY
    from tuneplan.estimator.gemm_efficiency import card_efficiency

    eff = card_efficiency(resolve_accelerator("rtx4090"), GEMM_EFFICIENCY["nvidia-ada"], False)
    assert eff.known == "measured" and "PeakGemm" in eff.source
    assert eff.fraction == pytest.approx(163.5 / 165.2, abs=0.005)
    t = estimate("meta-llama/Llama-2-7b-hf", method="lora", gpu="rtx4090").extras["sections"]["time"]
    assert f"{eff.fraction:.0%} of the 165.2 TFLOPS" in " ".join(t["assumptions"])


def test_the_3090_gemm_fraction_is_the_published_measurement() -> None:
    # zzc0721/torch-performance-test-data database.md: torch.matmul in bf16 on three RTX 3090 boards, 76.34,
    # 76.58 and 76.68 TFLOPS (mean 76.53), against the 71 TFLOPS dense bf16 peak (fp32 accumulate) of the
    # GA102 whitepaper, quoted at the reference boost clock that the boards run above
    from tuneplan.catalog.accelerators import resolve_accelerator
    from tuneplan.estimator.card_rates import GEMM_EFFICIENCY
    from tuneplan.estimator.gemm_efficiency import card_efficiency

    acc = resolve_accelerator("rtx3090")
    eff = card_efficiency(acc, GEMM_EFFICIENCY["nvidia-gddr"], False)
    assert acc.bf16_tflops_dense == 71.0
    assert eff.known == "measured" and "torch-performance-test-data" in eff.source
    assert eff.fraction == pytest.approx(76.53 / 71.0, abs=0.001)
