"""plan/candidates.py: every family's fate (pruned, dead, dominated or a candidate) and that the set keeps
the space's order and only setups that fit. Tiny model, so each set costs milliseconds."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import TINY_LLAMA
from tuneplan import resolve_accelerator
from tuneplan.plan.candidates import build_candidates
from tuneplan.plan.evaluate import Prober
from tuneplan.plan.margin import BAND
from tuneplan.specs.model import model_from_config

VARIANTS = [("full", {"method": "full"}), ("lora", {"method": "lora"}),
            ("qlora-4", {"method": "qlora", "bits": 4})]


@pytest.fixture(scope="module")
def model():
    return model_from_config(TINY_LLAMA, "tiny")


def candidate_set(model, gpu, *, every_reason=True, target=8, prefer="quality"):
    probe = Prober(model, gpu, {"seq": 256})
    return build_candidates(probe, VARIANTS, 1, target=target, margin=BAND, prefer=prefer,
                            every_reason=every_reason)


def test_every_family_has_one_fate(model):
    cs = candidate_set(model, resolve_accelerator("rtx4090"))
    with_candidate = {c.family for c in cs.candidates}
    assert with_candidate, "a 5 M-parameter model fits a 24 GB card"
    assert not with_candidate & set(cs.pruned)
    assert not with_candidate & set(cs.dominated)
    assert not set(cs.pruned) & set(cs.dominated)
    assert with_candidate | set(cs.pruned) | set(cs.dominated) <= set(cs.families)


def test_candidates_fit_keep_the_space_order_and_reach_the_target(model):
    gpu = resolve_accelerator("rtx4090")
    cs = candidate_set(model, gpu)
    order = [cs.families.index(c.family) for c in cs.candidates]
    assert order == sorted(order)
    for c in cs.candidates:
        assert c.estimate.fits and c.estimate.breakdown.device_peak_bytes <= gpu.memory_bytes
        assert not c.relaxed and c.global_batch == 8  # tiny model: micro-batch 8 without accumulation
        assert cs.order(c) == cs.candidates.index(c)


def test_the_set_is_the_same_with_or_without_every_reason(model):
    gpu = resolve_accelerator("rtx4090")
    full = candidate_set(model, gpu)
    lean = candidate_set(model, gpu, every_reason=False)
    assert [(c.family, c.batch, c.grad_accum) for c in full.candidates] == \
        [(c.family, c.batch, c.grad_accum) for c in lean.candidates]


def test_of_filters_by_method_and_strategy(model):
    cs = candidate_set(model, resolve_accelerator("rtx4090"))
    lora = cs.of("lora")
    assert lora and all(c.family.method == "lora" for c in lora)
    strategy = lora[0].family.strategy
    assert all(c.family.strategy == strategy for c in cs.of("lora", strategy))
    assert cs.of("no-such-method") == []


def test_best_is_one_of_the_candidates(model):
    cs = candidate_set(model, resolve_accelerator("rtx4090"))
    best = cs.best()
    assert best is not None and any(best is c for c in cs.candidates)
    best_lora = cs.best("lora")
    assert best_lora is not None and best_lora.family.method == "lora"


def test_a_card_too_small_for_the_cuda_context_has_no_candidate(model):
    # 0.25 GB of memory: below the CUDA context alone (512 MiB), so nothing fits at micro-batch 1
    small = dataclasses.replace(resolve_accelerator("rtx4090"), id="small-card", memory_gb_marketed=0.25,
                                memory_gib_usable_observed=None)
    cs = candidate_set(model, small)
    assert cs.candidates == [] and cs.best() is None


@pytest.mark.parametrize("prefer", ["quality", "speed"])
@pytest.mark.parametrize("case", ["tiny-2xh100", "qwen7b-rtx4090"])
def test_dominance_never_changes_the_recommendation(model, prefer, case):
    # the families the set skips as dominated would never have been chosen: deciding over a candidate for
    # every compatible family (none skipped) picks the same setup. Tiny: everything fits, 2 GPUs (every
    # strategy); Qwen2.5-7B on a 24 GB card: memory decides (full fine-tuning does not fit)
    from tests.conftest import QWEN25_7B
    from tuneplan.plan import rule
    from tuneplan.plan.evaluate import measure, plan_family

    spec, gpu, world = ((model, "h100", 2) if case == "tiny-2xh100"
                        else (model_from_config(QWEN25_7B, "qwen7b"), "rtx4090", 1))
    probe = Prober(spec, resolve_accelerator(gpu), {"seq": 256, "gpus": world})
    cs = build_candidates(probe, VARIANTS, world, target=16, margin=BAND, prefer=prefer)
    every = [c for f in cs.families if f not in cs.pruned
             if (c := plan_family(probe, f, target=16, world=world, margin=BAND)) is not None]
    if prefer == "quality":
        assert len(every) > len(cs.candidates)  # dominance did skip families here
    reference = rule.decide(every, prefer, lambda c: measure(probe, c, BAND), rule.NO_LIMITS).chosen
    chosen = cs.decide().chosen
    assert chosen is not None and reference is not None
    assert (chosen.family, chosen.batch, chosen.grad_accum) == \
        (reference.family, reference.batch, reference.grad_accum)
