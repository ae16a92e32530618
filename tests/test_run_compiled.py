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
from tuneplan.estimator.allocator_segments import LOSS_INSTANTS
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


@pytest.mark.parametrize("field, values", [("rank", (16, 64)), ("optimizer", ("adamw", "adamw-8bit"))])
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
