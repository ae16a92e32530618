"""A run resolved once answers like a fresh estimate at every shape it is reshaped to."""

from __future__ import annotations

import pytest

import tuneplan
from tuneplan.api import build_setup, estimate_run, resolve_run
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import resolve_model


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_reshaped_run_matches_a_fresh_estimate(method):
    spec = resolve_model("qwen2.5-0.5b")
    run = resolve_run(spec, build_setup(spec, method=method, batch=1, seq=256))
    estimate_run(run, gpu=None)  # fills the run's memo at grad_accum 1
    for shape in ({"batch": 4}, {"seq": 2048}, {"grad_accum": 4}, {"batch": 2, "seq": 1024, "grad_accum": 2}):
        fresh = tuneplan.estimate(spec, method=method, **{"batch": 1, "seq": 256, **shape}).to_dict()
        again = estimate_run(run.reshaped(**shape)).to_dict()
        assert again == fresh, shape


def test_reshaped_refuses_fields_that_need_resolving():
    spec = resolve_model("qwen2.5-0.5b")
    run = resolve_run(spec, build_setup(spec, method="lora"))
    with pytest.raises(ValueError):
        run.reshaped(rank=64)


def test_the_time_model_can_read_the_memory_parameter_plan():
    # LitGPT quantizes its lm_head too: the run's parameter plan (one for memory and time) counts it as stored
    spec = resolve_model("llama-2-7b")
    run = resolve_run(spec, build_setup(spec, method="qlora", framework="litgpt"))
    plain = resolve_run(spec, build_setup(spec, method="qlora", framework="hf"))
    assert run.profile.quantizes_lm_head and not plain.profile.quantizes_lm_head
    assert run.param_plan.weight_bytes < plain.param_plan.weight_bytes


SHAPES = ({"batch": 4}, {"seq": 2048}, {"grad_accum": 4}, {"batch": 2, "seq": 1024, "grad_accum": 2})


@pytest.mark.parametrize("setup", [
    {"method": "lora"},
    {"method": "qlora", "optimizer": "paged-adamw-8bit", "gradient_checkpointing": True},
    {"method": "full", "gpus": 2, "fsdp": True},  # the multi-GPU floor resolves a single-GPU run
    {"method": "full", "gpus": 4, "zero": 3, "offload": "optimizer"},
])
def test_reshaped_run_times_and_costs_like_a_fresh_estimate(setup):
    # time and cost come from terms kept on the run (per card): each shape must equal a fresh estimate
    from tuneplan.specs.dataset import DatasetSpec

    spec = resolve_model("qwen2.5-0.5b")
    data = DatasetSpec(samples=5000, avg_tokens=300)
    run = resolve_run(spec, build_setup(spec, batch=1, seq=256, **setup))
    estimate_run(run, gpu=resolve_accelerator("rtx4090"), dataset=data)  # fills the memo
    for gpu in ("rtx4090", "a100-80gb"):  # another card replaces the kept terms
        acc = resolve_accelerator(gpu)
        for shape in SHAPES:
            kw = {"batch": 1, "seq": 256, **setup, **shape}
            # by the card's own id: a short name adds how it was read (gpu.name_choice), which a run given
            # the Accelerator itself has no reason to carry
            fresh = tuneplan.estimate(spec, gpu=acc.id, dataset=data, **kw).to_dict()
            again = estimate_run(run.reshaped(**shape), gpu=acc, dataset=data).to_dict()
            assert again["time"] == fresh["time"] and again["cost"] == fresh["cost"], (gpu, shape)
            assert again == fresh


def test_a_warm_run_resolves_nothing_for_time(monkeypatch):
    # once a run was estimated on a card, other shapes re-plan neither FLOPs nor profile, dtypes, params
    from tuneplan.estimator import compute, time_statics, weights
    from tuneplan.estimator import run as run_module
    from tuneplan.specs import profiles

    spec = resolve_model("llama-2-7b")
    acc = resolve_accelerator("rtx4090")
    run = resolve_run(spec, build_setup(spec, method="lora", seq=512))
    first = estimate_run(run, gpu=acc).to_dict()["time"]

    def refuse(*a, **k):
        raise AssertionError("resolved again")

    for mod, name in ((time_statics, "flop_plan"), (compute, "get_profile"), (compute, "resolve_dtypes"),
                      (profiles, "get_profile"), (weights, "param_plan"), (run_module, "optimizer_plan")):
        monkeypatch.setattr(mod, name, refuse)
    for b in (1, 2, 8):
        for s in (128, 512, 4096):
            t = estimate_run(run.reshaped(batch=b, seq=s), gpu=acc).to_dict()["time"]
            assert t["tokens_per_step"] == b * s
    assert estimate_run(run, gpu=acc).to_dict()["time"] == first
