"""The throughput benchmark applies the calibration data's scoring rules: a tokens/s row that does not say
whether it is per GPU or the total of its GPUs is scored against both readings (0 inside the band, else the
distance to the nearer end); the reading faster than the card's dense peak allows is dropped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from throughput import band_error  # noqa: E402


@pytest.mark.parametrize(("predicted_s", "expected"), [
    (3.0, 0.0),  # inside [2, 8] seconds of work: no error
    (2.0, 0.0),
    (8.0, 0.0),
    (1.0, 2 / 1 - 1),  # faster than even the per-GPU reading: +100 % tokens/s too fast
    (10.0, 8 / 10 - 1),  # slower than the total reading: -20 %
])
def test_band_error(predicted_s: float, expected: float) -> None:
    assert band_error(predicted_s, 2.0, 8.0) == pytest.approx(expected)


def test_stated_row_is_a_band_of_one_point() -> None:
    assert band_error(4.0, 5.0, 5.0) == pytest.approx(5 / 4 - 1)


def test_multi_gpu_rows_of_unstated_metric_are_banded_or_read_as_totals() -> None:
    """On the shipped calibration rows: the 70B rows on 8 A100s cannot be per GPU (3,497 tokens/s per
    A100 of a 70B LoRA would exceed its 312 TFLOPS), so they are read as totals, never left unscored."""
    from throughput import run

    out = run(70.0)
    by_id = {r["row_id"]: r for r in out["results"]}
    if "M0154" not in by_id:
        pytest.skip("calibration rows without the torchtune Llama 3.1 table")
    m0154 = by_id["M0154"]
    assert m0154["band_s"] is None
    assert m0154["measured_s"] >= m0154["floor_s"]
    assert not out["source_inconsistent"]
