"""measure/compare.py: measured figures beside the analytic estimate of the same run, quantity by quantity."""

from __future__ import annotations

import pytest

from tests.conftest import TINY_LLAMA
from tuneplan import estimate
from tuneplan.measure.compare import compare
from tuneplan.measure.runner import MeasureResult
from tuneplan.specs.model import model_from_config

GIB = 1024**3


@pytest.fixture(scope="module")
def breakdown():
    return estimate(model_from_config(TINY_LLAMA, "tiny"), gpu="h100", method="lora", seq=256).breakdown


def result(kind: str, **kw) -> MeasureResult:
    return MeasureResult(model="tiny", setup={}, device="cuda" if kind == "cuda" else "cpu", device_name="x",
                         memory_kind=kind, memory_metric="m", steps=3, **kw)


def test_rows_pair_the_same_quantities(breakdown):
    b = breakdown
    rows = compare(result("cuda", persistent_bytes=2 * GIB, peak_bytes=3 * GIB, reserved_peak_bytes=4 * GIB,
                          nvml_device_peak_bytes=5 * GIB), b)
    by = {r["quantity"].split(" (")[0]: r for r in rows}
    c = b.components
    persistent = c.get("weights", 0) + c.get("quant_meta", 0) + c.get("lora_adapters", 0)
    first = rows[0]
    assert first["estimated_bytes"] == persistent and first["measured_bytes"] == 2 * GIB
    assert first["measured_over_estimated"] == pytest.approx(2 * GIB / persistent)
    assert by["allocated peak"]["estimated_bytes"] == b.allocated_peak_bytes
    assert by["reserved peak"]["estimated_bytes"] == b.reserved_peak_bytes
    assert by["device peak"]["estimated_bytes"] == b.device_peak_bytes
    assert by["device peak"]["measured_bytes"] == 5 * GIB
    # every instant's total is at most the allocated peak, the largest of them
    during = [r["estimated_bytes"] for r in rows if r["quantity"].startswith("peak during")]
    assert len(during) == 3 and all(v is not None and 0 < v <= b.allocated_peak_bytes for v in during)


def test_the_nvml_process_figure_is_preferred(breakdown):
    rows = compare(result("cuda", nvml_process_peak_bytes=7, nvml_device_peak_bytes=9), breakdown)
    assert rows[-1]["measured_bytes"] == 7 and rows[-1]["note"] == ""
    missing = compare(result("cuda"), breakdown)
    assert missing[-1]["measured_bytes"] is None and missing[-1]["note"] == "NVML not available"


def test_a_missing_figure_has_no_ratio(breakdown):
    rows = compare(result("cuda"), breakdown)
    assert all(r["measured_over_estimated"] is None for r in rows)
    gradients = next(r for r in rows if r["quantity"].startswith("gradients"))
    assert gradients["estimated_bytes"] is None  # the estimate shows gradients only at its peak instant


def test_a_cpu_run_is_labelled_indicative(breakdown):
    rows = compare(result("host", peak_bytes=GIB), breakdown)
    assert len(rows) == len(compare(result("cuda"), breakdown)) - 2  # no reserved or device rows
    assert all(r["note"].endswith("host RSS, indicative only") for r in rows)


def test_a_phase_is_compared_with_its_largest_instant():
    """FSDP2's forward has instants beside "forward" (the copy-outs of forward_layers_bottom / _top /
    _head): the measured forward peak is set beside the largest of them, as the backward one is beside the
    largest backward row."""
    est = estimate("meta-llama/Llama-2-7b-hf", gpu="h100", method="lora", gpus=2, fsdp=True, fsdp_version=2,
                   batch=1, seq=64, timing=False)
    inst = est.breakdown.instants
    forward = [v for k, v in inst.items() if k.startswith("forward")]
    backward = [v for k, v in inst.items() if k.startswith("backward")]
    assert len(forward) > 1 and len(backward) > 1
    rows = {r["quantity"]: r for r in compare(result("cuda", phase_peaks={"forward": GIB, "backward": GIB}),
                                             est.breakdown)}
    assert rows["peak during forward + loss"]["estimated_bytes"] == max(forward)
    assert rows["peak during backward"]["estimated_bytes"] == max(backward)
