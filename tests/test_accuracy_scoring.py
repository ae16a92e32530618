"""The accuracy benchmark's scoring rules, on hand-made rows: a row below its own physical floor is listed
apart (never scored, never counted as a wrong out-of-memory call); a row that states no metric is scored
against the [allocated, device] band; a row whose length is a truncation limit against the band from a
plausible shorter length to the bound; a row padded to its length holds its layer inputs in its floor;
every other row against its stated quantity."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from accuracy import below_floor, layer_inputs_bytes, run, score, summarize  # noqa: E402
from calibration_rows import _metric, shorter_length, stated_length  # noqa: E402

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


@pytest.mark.parametrize(("note", "kind"), [
    ("packed to 4096", "padded"),
    ("max_seq_len 2048 with packing=True", "padded"),
    ("fixed length 512", "padded"),
    ("no truncation; longest Alpaca sample forced into first iteration", "padded"),
    ("no truncation; batch padded to longest in batch; value = longest Alpaca sample", "padded"),
    ("max_seq_length 512 (truncation); batches padded to longest in batch", "bound"),
    ("truncation at 512", "bound"),
    ("'Seq Length' as stated in table", "bound"),
    ("none (unpacked; max_seq_len 4096)", "bound"),
    ("", "unstated"),
])
def test_what_a_stated_length_is(note: str, kind: str) -> None:
    assert stated_length(note) == kind


@pytest.mark.parametrize(("measured", "metric", "expected"), [
    (12, "allocated", 0.0),  # between the estimates at the shorter length (10) and at the bound (14)
    (9, "allocated", (10 - 9) / 9),  # below the shorter length's estimate
    (15, "allocated", (14 - 15) / 15),  # above the bound's
    (16, "unknown", 0.0),  # no metric either: [allocated at the shorter length 8, device at the bound 17]
    (7, "unknown", (8 - 7) / 7),
])
def test_a_truncation_bound_is_scored_against_the_length_band(measured: int, metric: str,
                                                               expected: float) -> None:
    # at the bound: stated quantity 14, allocated 14, device 17; at the shorter length: stated 10, allocated 8
    err, how = score(measured * GIB, metric, 14 * GIB, 14 * GIB, 17 * GIB, short=(10 * GIB, 8 * GIB))
    assert how == "length band" and err == pytest.approx(expected)


def test_a_padded_row_holds_every_layer_input_in_its_floor() -> None:
    # Llama-2-7B, bf16, batch 2 x 512: 32 layers x 2 x 512 x 4096 hidden x 2 bytes
    from tuneplan.catalog.models import resolve_model

    spec = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)
    setup = {"method": "lora", "precision": "bf16", "batch": 2, "seq": 512}
    assert layer_inputs_bytes(spec, setup) == 32 * 2 * 512 * 4096 * 2
    assert layer_inputs_bytes(spec, {**setup, "activation_offload": True}) == 0


def test_the_shorter_length_is_the_default_datas_longest_sample_under_the_bound() -> None:
    # the LitGPT rows state Alpaca's longest sample for the Llama-2 tokenizer (1304 tokens); torchtune's
    # recipes train on Alpaca when the table names no dataset; a bound below that sample: half the bound
    row = {"task": "SFT (dataset not stated in table)", "source_group": "torchtune",
           "model_hf_id": "meta-llama/Llama-2-70b-hf"}
    assert shorter_length(row, 4096) == 1304
    assert shorter_length(row, 1024) == 512
    assert shorter_length({**row, "task": "SFT", "source_group": "hf-peft"}, 4096) == 2048
