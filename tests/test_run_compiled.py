"""What is resolved once per run and reused at every shape: the folded layer kinds (activation_terms.
LinearKinds, upper_temp_per_token), the default logits chain's widths (logits.default_chain) and the plain
layer scratch (MemoryStatics.plain_scratch) give exactly the numbers of the unfolded formulas; a run never
reads another run's kept terms, and a reshaped run answers like a fresh resolve."""

from __future__ import annotations

import copy
import dataclasses

import pytest

import tuneplan
from tuneplan import api
from tuneplan.api import build_setup, estimate_run, resolve_run
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.activations import saved_at
from tuneplan.estimator.allocator_segments import LOSS_INSTANTS, reserved_figures, stranded_terms
from tuneplan.estimator.instants import memory_at
from tuneplan.estimator.memory import memory_of
from tuneplan.estimator.memory_statics import memory_statics

SETUPS = [
    {"method": "lora"},  # linear kinds, a lower kind (the first adapted layer), the default chain
    {"method": "lora", "attn": "eager"},  # eager attention's position terms: not folded
    {"method": "qlora", "gradient_checkpointing": True},  # checkpointed: not folded
    {"method": "full"},  # the embedding's backward instant
    {"method": "full", "precision": "fp32", "framework": "litgpt"},  # another logits chain
    {"method": "full", "gpus": 4, "zero": 3},  # a wrapper's rows
    {"method": "lora", "gpus": 2, "fsdp": True},
]
SHAPES = [(1, 128), (3, 512), (8, 2048)]


def _run(setup: dict, **shape: int):
    spec = resolve_model("qwen2.5-0.5b")
    return resolve_run(spec, build_setup(spec, **{"batch": 1, "seq": 128, **setup, **shape}))


@pytest.mark.parametrize("setup", SETUPS)
def test_folded_kinds_give_the_unfolded_sums(setup) -> None:
    # every kind compared one by one (linear=None, upper_temp_per_token=None) against the folded products
    terms = memory_statics(_run(setup)).acts
    plain = dataclasses.replace(terms, linear=None, upper_temp_per_token=None)
    for batch, seq in SHAPES:
        folded, unfolded = saved_at(terms, batch, seq), saved_at(plain, batch, seq)
        for f in dataclasses.fields(folded):
            if f.name != "terms":
                assert getattr(folded, f.name) == getattr(unfolded, f.name), (f.name, batch, seq)
        assert folded.upper_backward_temp_bytes == unfolded.upper_backward_temp_bytes


def test_the_one_gpu_lora_run_is_folded() -> None:
    # the benchmark's path takes every shortcut: folded kinds, the upper kinds' scratch, the default chain
    statics = memory_statics(_run({"method": "lora"}))
    assert statics.acts.linear is not None and statics.acts.upper_temp_per_token is not None
    assert statics.logits_per_elem is not None and statics.plain_scratch


@pytest.mark.parametrize("setup", SETUPS)
def test_the_shortcuts_give_the_general_rows(setup) -> None:
    # the same run with the per-run shortcuts switched off: every instant's row must be the same
    run = _run(setup)
    statics = memory_statics(run)
    general = copy.copy(statics)
    object.__setattr__(general, "logits_per_elem", None)
    object.__setattr__(general, "plain_scratch", False)
    object.__setattr__(general, "acts", dataclasses.replace(statics.acts, linear=None,
                                                            upper_temp_per_token=None))
    slow = dataclasses.replace(run, memo={"memory": general})
    for batch, seq in SHAPES:
        assert memory_at(run, batch, seq).rows == memory_at(slow, batch, seq).rows, (batch, seq)
    # memory_of reads the loss instants as the first two rows
    assert list(memory_at(run, 1, 128).rows)[:2] == list(LOSS_INSTANTS)


@pytest.mark.parametrize("field, values", [("rank", (16, 64)), ("optimizer", ("adamw", "adamw-8bit")),
                                           ("gradient_checkpointing", (False, True))])
def test_a_run_never_reads_another_runs_kept_terms(field, values) -> None:
    # two runs differing in one field that is not the shape: the second, estimated after the first has
    # filled its caches (the api's resolved runs, the run's memo), gives what it gives on its own
    spec = resolve_model("qwen2.5-0.5b")
    kw = {"method": "lora", "batch": 2, "seq": 512}
    first, second = ({**kw, field: v} for v in values)
    api._RESOLVED.clear()
    fresh = tuneplan.estimate(spec, **second).to_dict()
    api._RESOLVED.clear()
    a = tuneplan.estimate(spec, **first).to_dict()
    b = tuneplan.estimate(spec, **second).to_dict()
    assert b == fresh and a["per_gpu"] != b["per_gpu"]
    # the same through resolved runs: one's memo is not the other's
    run_a = resolve_run(spec, build_setup(spec, **first))
    memory_of(run_a)
    run_b = resolve_run(spec, build_setup(spec, **second))
    assert run_b.memo is not run_a.memo
    assert memory_of(run_b).to_dict() == memory_of(_fresh(spec, second)).to_dict()
    assert memory_of(run_b).to_dict() != memory_of(run_a).to_dict()


def _fresh(spec, kw):
    return resolve_run(spec, build_setup(spec, **kw))


@pytest.mark.parametrize("setup", SETUPS)
def test_a_reshaped_run_gives_a_fresh_resolves_numbers(setup) -> None:
    run = _run(setup)
    estimate_run(run)  # fills the memo at the first shape
    for batch, seq in SHAPES:
        again = memory_of(run.reshaped(batch=batch, seq=seq)).to_dict()
        assert again == memory_of(_run(setup, batch=batch, seq=seq)).to_dict(), (batch, seq)


@pytest.mark.parametrize("setup", SETUPS)
def test_instants_left_out_of_the_peak_choice_never_peak(setup) -> None:
    # peak_candidates: where backward_start_leads holds, forward's total is below backward_start's at every
    # shape; where step_below_bottom holds, optimizer_step is the last row and never above the bottom
    # layer's; memory_of answers as it does with both shortcuts off (every row totalled)
    run = _run(setup)
    statics = memory_statics(run)
    general = copy.copy(statics)
    object.__setattr__(general, "backward_start_leads", False)
    object.__setattr__(general, "step_below_bottom", False)
    slow = dataclasses.replace(run, memo={"memory": general})
    for batch, seq in SHAPES:
        at = memory_at(run, batch, seq)
        if statics.backward_start_leads:
            assert at.total("forward") < at.total("backward_start"), (batch, seq)
        if statics.step_below_bottom:  # peak_candidates.step_below_bottom: the last row, never above
            assert list(at.rows)[-1] == "optimizer_step"
            assert at.total("optimizer_step") <= at.total("backward_layers_bottom"), (batch, seq)
        shaped, slow_shaped = run.reshaped(batch=batch, seq=seq), slow.reshaped(batch=batch, seq=seq)
        assert memory_of(shaped).to_dict() == memory_of(slow_shaped).to_dict(), (batch, seq)


def test_the_one_gpu_lora_run_totals_neither_forward_nor_the_step() -> None:
    statics = memory_statics(_run({"method": "lora"}))
    assert statics.backward_start_leads and statics.step_below_bottom
    # a full fine-tune's step holds AdamW's foreach temporaries beside every gradient: it can peak
    assert not memory_statics(_run({"method": "full"})).step_below_bottom


@pytest.mark.parametrize("setup", SETUPS + [{"method": "lora", "gradient_checkpointing": True}])
def test_the_stranded_bound_gives_the_rounded_blocks_figures(setup) -> None:
    # allocator_segments.reserved_figures at one shape skips rounding the stranded blocks where their bound
    # (tokens x W + n x 2 MiB) leaves the loss instants under the tails: the same figures as the blocks
    # rounded one by one (bound_per_token None), on both sides of the bound
    run = _run(setup)
    terms = stranded_terms(run)
    slow = dataclasses.replace(run, memo={"stranded": terms._replace(bound_per_token=None)})
    mib = 2**20
    for batch, seq in SHAPES:
        tokens = batch * seq
        for allocated in (10 * mib, 1000 * mib, 100_000 * mib):
            for at_forward, at_backward in ((allocated, allocated), (allocated // 2, allocated - 3 * mib)):
                got = reserved_figures(run, allocated, at_forward, at_backward, tokens)
                assert got == reserved_figures(slow, allocated, at_forward, at_backward, tokens)


def test_the_stranded_bound_is_per_run() -> None:
    # Llama-2-7B LoRA (q_proj, v_proj), bf16-mixed, no checkpointing: the SiLU-up product (one tokens x
    # 11008 x 2 B block), RMSNorm's fp32 tokens x 4096 x 4 B and the 16-bit logits, tokens x 32000 x 2 B:
    # W = 22016 + 16384 + 64000 bytes per token over 3 blocks; checkpointing packs the checkpoints: no bound
    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    terms = stranded_terms(resolve_run(spec, build_setup(spec, method="lora", precision="bf16-mixed")))
    assert (terms.bound_per_token, terms.bound_segments) == (22016 + 16384 + 64000, 3 * 2**20 * 2)
    packed = stranded_terms(resolve_run(spec, build_setup(spec, method="lora", precision="bf16-mixed",
                                                          gradient_checkpointing=True)))
    assert packed.bound_per_token is None and packed.packed_layers == 32


@pytest.mark.parametrize("setup", [
    # a full fine-tune's untied head: its new weight gradient meets an accumulated buffer only under
    # accumulation (head_gradient.py), so the choice must not survive a reshape from one micro-batch
    {"method": "full", "framework": "litgpt", "precision": "bf16", "optimizer": "paged-adamw-8bit",
     "gradient_checkpointing": True},
    {"method": "full", "precision": "bf16-mixed"},
    {"method": "lora"},
    {"method": "full", "gpus": 2, "zero": 1},
])
@pytest.mark.parametrize("accumulations", [(1, 32), (32, 1)])
def test_a_run_reshaped_across_accumulation_answers_like_a_fresh_resolve(setup, accumulations) -> None:
    # the planner resolves a family once and reshapes it (plan.sizes.Shared.run): every number of the
    # reshaped run, memory and time, must be those of the setup resolved at that accumulation
    spec = resolve_model("meta-llama/Llama-3.2-1B")  # untied head
    gpu = tuneplan.catalog.accelerators.resolve_accelerator("l20")
    first, then = accumulations
    base = resolve_run(spec, build_setup(spec, batch=2, seq=512, grad_accum=first, **setup))
    estimate_run(base, gpu=gpu)  # fills the run's memo at the first accumulation
    reshaped = estimate_run(base.reshaped(grad_accum=then), gpu=gpu)
    fresh_setup = build_setup(spec, batch=2, seq=512, grad_accum=then, **setup)
    fresh = estimate_run(resolve_run(spec, fresh_setup), gpu=gpu)
    assert reshaped.breakdown.to_dict() == fresh.breakdown.to_dict()
    assert reshaped.to_dict()["time"] == fresh.to_dict()["time"]
