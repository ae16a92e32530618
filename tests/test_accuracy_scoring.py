"""The accuracy benchmark's scoring rules, on hand-made rows: a row below its own physical floor is listed
apart (never scored, never counted as a wrong out-of-memory call); a row that states no metric is scored
against the [allocated, device] band; every other row against its stated quantity."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from accuracy import below_floor, run, score, summarize  # noqa: E402
from calibration_rows import _metric  # noqa: E402

GIB = 1024**3


def test_stated_metric_is_scored_as_published() -> None:
    err, how = score(10 * GIB, "allocated", 11 * GIB, 11 * GIB, 13 * GIB)
    assert how == "stated" and err == pytest.approx(0.10)


@pytest.mark.parametrize(("measured", "expected"), [
    (12, 0.0),  # inside [10, 14]: no error
    (10, 0.0),  # on the allocated end
    (14, 0.0),  # on the device end
    (20, (14 - 20) / 20),  # above the device peak: under-predicted by the distance to the device end
    (8, (10 - 8) / 8),  # below the allocated peak: over-predicted by the distance to the allocated end
])
def test_unstated_metric_is_scored_against_the_band(measured: int, expected: float) -> None:
    err, how = score(measured * GIB, "unknown", 10 * GIB, 10 * GIB, 14 * GIB)
    assert how == "band" and err == pytest.approx(expected)


def test_the_floor_alone_decides() -> None:
    # 7B bf16 weights (14e9 B) + AdamW bf16 states (28e9 B): a published 30e9 B cannot be that run
    floor = 14 * 10**9 + 28 * 10**9
    assert below_floor(30 * 10**9, floor)
    assert not below_floor(42 * 10**9, floor)  # on the floor is possible


def test_metrics_that_name_no_reading_are_unknown() -> None:
    assert _metric("per-GPU memory consumed (method not stated)") == "unknown"
    assert _metric("GRAM (method not stated)") == "unknown"
    assert _metric("not stated (README: averaged over multiple runs)") == "unknown"
    assert _metric("torch.cuda.max_memory_allocated") == "allocated"
    assert _metric("nvidia-smi/NVML device memory used after training") == "device"


def _row(rid: str, err: float, how: str, false_oom: bool = False, gpus: int = 1) -> dict:
    return {"row_id": rid, "framework": "hf", "method": "lora", "confidence": "high", "rel_error": err,
            "scored_as": how, "false_oom": false_oom, "gpus": gpus}


def test_summary_counts_each_way_and_leaves_floor_rows_out() -> None:
    rows = [_row("a", 0.0, "band"), _row("b", 0.1, "stated"), _row("c", -0.2, "stated", gpus=2)]
    floor_rows = [{"row_id": "d", "false_oom": True}]
    s = summarize(rows, [], floor_rows)
    assert (s["scored_stated"], s["scored_band"], s["below_floor"]) == (2, 1, 1)
    assert s["overall"]["count"] == 3 and s["false_oom_on_measured_rows"] == 0
    assert s["multi_gpu"]["count"] == 1 and s["multi_gpu"]["bias"] == pytest.approx(-0.2)


def test_floor_rows_are_apart_in_the_real_benchmark() -> None:
    res = run("analytic")
    scored = {r["row_id"] for r in res["rows"]}
    for r in res["below_floor"]:
        assert r["measured_bytes"] < r["floor_bytes"] and r["row_id"] not in scored
    assert res["summary"]["below_floor"] == len(res["below_floor"])
