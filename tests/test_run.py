"""A run resolved once answers like a fresh estimate at every shape it is reshaped to."""

from __future__ import annotations

import pytest

import tuneplan
from tuneplan.api import build_setup, estimate_run, resolve_run
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
