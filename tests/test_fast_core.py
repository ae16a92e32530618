"""The fast core's shortcuts change no figure: the scalar helpers are the builtins, and what a warm run keeps
(per-sequence FLOP counts, the hourless cost section) is what a fresh estimate computes, never shared."""

from __future__ import annotations

import numpy as np

import tuneplan
from tuneplan.api import build_setup, estimate_run, resolve_run
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.compute import flops_at
from tuneplan.estimator.xp import maximum, minimum, to_int


def test_xp_on_numbers_is_the_builtins_and_on_arrays_element_wise():
    # builtins: max / min return the first argument on a tie, so the type follows it
    assert maximum(0.0, 0) == 0 and type(maximum(0.0, 0)) is float
    assert type(minimum(3, 3.0)) is int
    assert maximum(1, 2.5) == 2.5 and minimum(1, 2.5) == 1
    assert to_int(2.9) == 2 and to_int(-2.9) == -2 and type(to_int(7.0)) is int
    a = np.array([1, 5, 3], dtype=np.int64)
    assert maximum(a, 3).tolist() == [3, 5, 3]
    assert minimum(4, a).tolist() == [1, 4, 3]
    assert maximum(np.int64(2), 3) == 3  # a numpy scalar goes through numpy
    t = to_int(np.array([2.9, -2.9, 1e15 + 0.5]))
    assert t.dtype == np.int64 and t.tolist() == [2, -2, 10**15]


def test_flop_count_kept_per_seq_is_the_count_of_a_fresh_plan():
    spec = resolve_model("llama-2-7b")
    acc = resolve_accelerator("rtx4090")
    run = resolve_run(spec, build_setup(spec, method="lora", seq=512))
    estimate_run(run, gpu=acc)
    for b in (1, 3, 8):
        estimate_run(run.reshaped(batch=b), gpu=acc)
    plan = run.memo["time"][2].flops
    assert flops_at(plan, 512) is flops_at(plan, 512)  # counted once, reused by every batch
    fresh_run = resolve_run(spec, build_setup(spec, method="lora", seq=512, batch=8))
    estimate_run(fresh_run, gpu=acc)
    fresh = fresh_run.memo["time"][2].flops
    assert fresh is not plan and flops_at(fresh, 512) == flops_at(plan, 512)


def test_a_warm_run_hands_each_caller_its_own_cost_section():
    spec = resolve_model("qwen2.5-0.5b")
    acc = resolve_accelerator("rtx4090")
    run = resolve_run(spec, build_setup(spec, method="lora", batch=2, seq=256))
    first = estimate_run(run, gpu=acc).to_dict()
    first["cost"]["assumptions"].append("changed by a caller")
    first["cost"]["unknown"].append("changed by a caller")
    first["cost"]["gpus"] = 99
    again = estimate_run(run.reshaped(batch=4), gpu=acc).to_dict()
    fresh = tuneplan.estimate(spec, gpu="rtx4090", method="lora", batch=4, seq=256).to_dict()
    assert again["cost"] == fresh["cost"]
    assert "changed by a caller" not in again["cost"]["assumptions"] + again["cost"]["unknown"]
    assert again == fresh
