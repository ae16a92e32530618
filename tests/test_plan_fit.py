"""`fit`: every limit agrees with a plain loop over the estimator, and sits exactly on the boundary."""

from __future__ import annotations

import pytest

from tuneplan.api import estimate
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.plan import fit
from tuneplan.plan.fit import METHOD_VARIANTS
from tuneplan.plan.measures import BY_KEY, LADDER, applicable, compose

GIB = 2**30


@pytest.fixture(scope="module")
def qwen7b():
    return resolve_model("Qwen/Qwen2.5-7B")


@pytest.fixture(scope="module")
def v100_report(qwen7b):
    return fit(qwen7b, "v100")


@pytest.fixture(scope="module")
def rtx4090_report(qwen7b):
    return fit(qwen7b, "rtx4090", seq=1024)


def fits(model, gpu, setup: dict, **change) -> bool:
    return bool(estimate(model, gpu=gpu, **{**setup, **change}).fits)


def fits_or_refused(model, gpu, setup: dict) -> bool:
    """False for a combination the setup validation refuses (ZeRO on one GPU without offload)."""
    try:
        return fits(model, gpu, setup)
    except TuneplanError:
        return False


def plain_loop_max(model, gpu, setup: dict, name: str, cap: int) -> int | None:
    """The dumb answer: walk up from 1 until it stops fitting."""
    best = None
    for x in range(1, cap + 1):
        if not fits(model, gpu, setup, **{name: x}):
            break
        best = x
    return best


def _setup_fields(m) -> dict:
    s = dict(m.setup)
    if s["method"] != "qlora":
        s.pop("bits")
    return s


@pytest.mark.parametrize("report", ["v100_report", "rtx4090_report"])
def test_batch_limit_is_the_plain_loop_answer_and_a_boundary(report, qwen7b, request) -> None:
    r = request.getfixturevalue(report)
    gpu = resolve_accelerator(r.gpu["id"])
    for m in r.methods:
        if not m.fits:
            continue
        s = _setup_fields(m)
        assert fits(qwen7b, gpu, s), m.method  # the reported setup itself fits
        assert m.max_batch == plain_loop_max(qwen7b, gpu, s, "batch", m.max_batch + 1), m.method
        assert fits(qwen7b, gpu, s, batch=m.max_batch)
        assert not fits(qwen7b, gpu, s, batch=m.max_batch + 1)


def test_sequence_limit_is_a_boundary_and_matches_the_loop_where_short(v100_report, qwen7b) -> None:
    gpu = resolve_accelerator("v100")
    lora = v100_report.method("lora")
    s = _setup_fields(lora)
    assert lora.limited_by["seq"] == "memory"
    assert fits(qwen7b, gpu, s, seq=lora.max_seq) and not fits(qwen7b, gpu, s, seq=lora.max_seq + 1)
    # plain loop over the last few hundred lengths (memory is monotone, so the loop from 1 agrees)
    lo = lora.max_seq - 300
    assert all(fits(qwen7b, gpu, s, seq=x) for x in range(lo, lora.max_seq + 1))
    for m in v100_report.methods:
        if m.fits and m.limited_by["seq"] == "memory":
            sm = _setup_fields(m)
            assert fits(qwen7b, gpu, sm, seq=m.max_seq) and not fits(qwen7b, gpu, sm, seq=m.max_seq + 1), m.method


def test_rank_limit_is_a_boundary_or_the_cap(rtx4090_report, qwen7b) -> None:
    gpu = resolve_accelerator("rtx4090")
    for m in rtx4090_report.methods:
        if not m.fits:
            continue
        if m.method in ("full", "freeze"):
            assert m.max_rank is None
            continue
        s = _setup_fields(m)
        assert fits(qwen7b, gpu, s, rank=m.max_rank)
        if m.limited_by["rank"] == "cap":
            assert m.max_rank == qwen7b.hidden
        else:
            assert not fits(qwen7b, gpu, s, rank=m.max_rank + 1)


def test_requires_is_the_first_fitting_rung_then_minimal(v100_report, qwen7b) -> None:
    """Brute force over the ladder: the most expensive measure is the first rung that fits; none is spare."""
    gpu = resolve_accelerator("v100")
    for (label, fixed), m in zip(METHOD_VARIANTS, v100_report.methods, strict=True):
        assert m.method == label
        if not m.fits or not m.requires:
            continue
        rungs = applicable(fixed)
        first = next(i for i in range(len(rungs))
                     if fits_or_refused(qwen7b, gpu, {**fixed, **compose(rungs[: i + 1])}))
        assert LADDER.index(BY_KEY[m.requires[-1]]) == LADDER.index(rungs[first]), label
        for k in m.requires:  # minimal: dropping any one measure no longer fits (or is refused)
            rest = [BY_KEY[x] for x in m.requires if x != k]
            assert not fits_or_refused(qwen7b, gpu, {**fixed, **compose(rest)}), (label, k)


def test_v100_has_no_bf16_so_every_method_runs_fp16_without_a_measure(v100_report) -> None:
    # compat.md 3.1: bf16 needs compute capability >= 8.0; a V100 is 7.0. The profile picks fp16 itself
    for m in v100_report.methods:
        if m.fits:
            assert m.setup["precision"] == "fp16-mixed" and "fp16-mixed" not in m.requires


def test_explicit_bf16_on_a_v100_is_kept_and_cannot_run(qwen7b) -> None:
    r = fit(qwen7b, "v100", method="lora", precision="bf16-mixed")
    m = r.methods[0]
    assert not m.fits and m.blocked_by and r.recommended is None


def test_7b_full_fine_tune_does_not_fit_a_24gb_card_in_any_way(rtx4090_report) -> None:
    # by hand: bf16-mixed AdamW keeps fp32 weights, fp32 grads and two fp32 states = 16 B/param before
    # any saving; even 16-bit weights + 16-bit grads alone are 4 B x 7.6e9 = 28 GiB > 23.8 GiB usable
    assert not rtx4090_report.method("full").fits
    assert rtx4090_report.method("qlora-4").fits


def test_70b_qlora_4bit_fits_one_a100_80gb_and_16bit_lora_does_not() -> None:
    # seed 004 FAQ Q2. By hand: 16-bit base of Llama-2-70B is 2 B x 69e9 = 128 GiB > 79 GiB (LoRA cannot fit);
    # 4-bit NF4 base is ~0.5 B x 64.4e9 block linears + 2 x 32000 x 8192 x 4 B fp32 embeddings ~ 32 GiB
    r = fit("meta-llama/Llama-2-70b-hf", "a100-80gb")
    assert r.method("qlora-4").fits and not r.method("lora").fits and not r.method("full").fits
    assert 30 * GIB < r.method("qlora-4").device_peak_bytes < 79.21 * GIB


def test_multi_gpu_lists_every_strategy_and_ddp_cannot_hold_a_7b_full_replica(qwen7b) -> None:
    r = fit(qwen7b, "a100-80gb", gpus=8, method="full")
    full = r.methods[0]
    names = [s["strategy"] for s in full.strategies]
    assert names == ["ddp", "zero-1", "zero-2", "zero-3", "fsdp"]
    by = {s["strategy"]: s for s in full.strategies}
    # by hand: a DDP replica keeps 16 B/param x 7.6e9 = 113 GiB of weights, grads and states > 79 GiB
    assert not by["ddp"]["fits"]
    assert by["zero-3"]["fits"] and by["zero-3"]["max_batch"] >= by["zero-1"]["max_batch"]
    assert full.fits and full.strategy.startswith("zero")


def test_recommended_reaches_the_global_batch_with_the_largest_dividing_micro_batch(v100_report, qwen7b) -> None:
    gpu = resolve_accelerator("v100")
    rec = v100_report.recommended
    assert rec["micro_batch"] * rec["grad_accum"] * rec["world_size"] == 16 == rec["global_batch"]
    s = dict(rec["setup"])
    if s["method"] != "qlora":
        s.pop("bits")
    assert fits(qwen7b, gpu, s)
    # no larger micro-batch that divides 16 fits at its own accumulation
    for b in range(rec["micro_batch"] + 1, 17):
        if 16 % b == 0:
            assert not fits(qwen7b, gpu, s, batch=b, grad_accum=16 // b)
    assert rec["reason"] and rec["command"].startswith("tuneplan estimate")
    # the most faithful method that fits without offload: full fits only with offload on a V100
    full = v100_report.method("full")
    assert rec["method"] == "lora" and (not full.fits or "offload" in full.strategy)


def test_global_batch_that_the_gpus_cannot_split(qwen7b) -> None:
    r = fit(qwen7b, "a100-80gb", gpus=3, method="lora", global_batch=16)
    rec = r.recommended
    assert rec["global_batch"] >= 16 and rec["global_batch"] == rec["micro_batch"] * rec["grad_accum"] * 3
    assert "cannot split" in rec["reason"]


def test_equal_memory_ranks_are_boundaries_and_qlora_reaches_higher_ranks(v100_report, qwen7b) -> None:
    """Seed 002 ("QLoRA allows a higher rank at the same memory"), computed not repeated."""
    eq = v100_report.equal_memory
    lora = v100_report.method("lora")
    budget = eq["budget_bytes"]
    assert budget == lora.device_peak_bytes
    gpu = resolve_accelerator("v100")
    for key, r in eq["qlora"].items():
        bits = int(key[-1])
        s = {**_setup_fields(lora), "method": "qlora", "bits": bits}
        if r is None:  # only when the card cannot run it at all (8-bit bitsandbytes needs CC >= 7.5)
            assert any(f.level == "error" for f in estimate(qwen7b, gpu=gpu, **s).findings)
            continue
        assert r >= lora.setup["rank"]  # a quantized base leaves more room for adapters
        assert estimate(qwen7b, gpu=gpu, **{**s, "rank": r}).breakdown.device_peak_bytes <= budget
        if r < qwen7b.hidden:
            assert estimate(qwen7b, gpu=gpu, **{**s, "rank": r + 1}).breakdown.device_peak_bytes > budget
    assert eq["qlora"]["qlora-4"] >= (eq["qlora"]["qlora-8"] or 0)


def test_json_shape(v100_report) -> None:
    d = v100_report.to_dict()
    assert set(d) >= {"methods", "recommended"}
    for m in d["methods"]:
        assert set(m) >= {"method", "fits", "max_batch", "max_seq", "max_rank", "requires", "setup"}
        assert {"method", "batch", "seq", "precision", "optimizer", "zero"} <= set(m["setup"])
    assert {"setup", "reason"} <= set(d["recommended"])


def test_nothing_fits_reports_no_limits_and_no_recommendation() -> None:
    r = fit("meta-llama/Llama-3.1-405B-Instruct", "rtx-3060-12gb", method="full")
    m = r.methods[0]
    assert not m.fits and m.max_batch is None and m.requires == [] and r.recommended is None
    assert m.headroom_bytes < 0


def test_bad_input_names_the_field() -> None:
    with pytest.raises(TuneplanError) as e:
        fit("Qwen/Qwen2.5-7B", "rtx4090", method="qlora", bits=3)
    assert e.value.field == "method" or e.value.field == "bits"
    with pytest.raises(TuneplanError) as e:
        fit("Qwen/Qwen2.5-7B", "rtx4090", global_batch=0)
    assert e.value.field == "global_batch"
    with pytest.raises(TuneplanError) as e:
        fit("Qwen/Qwen2.5-7B", "rtx4090", zero=3)  # ZeRO on one GPU without offload
    assert e.value.field == "zero"


def test_fields_the_user_set_are_never_overridden_by_a_measure(qwen7b) -> None:
    free = fit(qwen7b, "a100-40gb", gpus=2, method="full")
    pinned = fit(qwen7b, "a100-40gb", gpus=2, method="full", optimizer="adamw", offload="none")
    overridable = {"adamw-8bit", "paged-adamw-8bit", "offload-optimizer", "offload-all"}
    assert overridable & set(free.methods[0].requires)  # left open, a measure may take it
    m = pinned.methods[0]
    assert m.setup["optimizer"] == "adamw" and m.setup["offload"] == "none"
    assert not overridable & set(m.requires)
