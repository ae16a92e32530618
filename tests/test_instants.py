"""An instant's row is built as a plain tuple (the hot path) and read by name through ``InstantRow``: the
order the builder writes must be the order ``InstantRow`` names. Each check puts a quantity the per-run or
per-shape terms name (the optimizer step's temporaries, the gathered ZeRO-3 parameters, the loss's
backward, ...) in the column that bears its name, on setups where those quantities differ from each other,
so a swapped pair of columns fails."""

from __future__ import annotations

import pytest

from tuneplan.api import build_setup, resolve_run
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.instants import STEP_COMPONENTS, InstantRow, components_of, memory_at, named
from tuneplan.estimator.types import COMPONENTS

SETUPS = [
    # single GPU, fp32 weights under autocast: autocast copies exist; transformers' AdamW steps one tensor at
    # a time (temporaries of the largest tensor, not of all gradients); accumulation keeps gradients through
    # the forward
    ("Qwen/Qwen2.5-0.5B", {"method": "full", "precision": "fp16-mixed", "optimizer": "adamw-hf", "batch": 2,
                           "seq": 512, "grad_accum": 2}),
    # ZeRO-3 over 2 GPUs: gathered parameters at every instant, sharded gradients
    ("Qwen/Qwen2.5-0.5B", {"method": "lora", "zero": 3, "gpus": 2, "batch": 2, "seq": 512}),
    ("meta-llama/Llama-3.2-1B", {"method": "full", "gradient_checkpointing": True, "precision": "bf16-mixed",
                                 "batch": 1, "seq": 1024}),
]


def at(model: str, kw: dict):
    spec = resolve_model(model)
    run = resolve_run(spec, build_setup(spec, **kw))
    return memory_at(run, run.setup.batch, run.setup.seq)


def test_the_row_names_are_the_step_components_in_display_order() -> None:
    assert STEP_COMPONENTS == InstantRow._fields
    # the display order (types.COMPONENTS) lists the step components in the same order
    assert [c for c in COMPONENTS if c in STEP_COMPONENTS] == list(STEP_COMPONENTS)


@pytest.mark.parametrize(("model", "kw"), SETUPS)
def test_each_quantity_lands_in_the_column_of_its_name(model, kw) -> None:
    m = at(model, kw)
    st, acts, logits = m.statics, m.acts, m.logits
    for row in m.rows.values():
        assert len(row) == len(InstantRow._fields)
    step = named(m.rows["optimizer_step"])
    assert (step.gradients, step.optimizer_temp, step.parallel_buffers) == (st.step_grads, st.step_temp, 0)
    start = named(m.rows["backward_start"])
    assert start.logits_loss == logits.backward_peak
    assert start.parallel_buffers == st.gathered_at_loss
    assert start.autocast_copies == st.autocast_copies_backward
    assert start.activations == acts.saved_bytes
    forward = named(m.rows["forward"])
    assert forward.gradients == st.earlier_grads
    assert forward.autocast_copies == st.autocast_copies
    assert forward.parallel_buffers == st.gathered_at_forward_end
    assert forward.logits_loss >= logits.forward_peak > 0
    bottom = named(m.rows["backward_layers_bottom"])
    assert bottom.backward_temp == acts.backward_temp_bytes + st.dequant > 0
    assert bottom.parallel_buffers == st.gathered


def test_the_setups_tell_the_columns_apart() -> None:
    """The checks above would miss a swap of two columns that hold the same value: on these setups the
    quantities they compare differ."""
    single, zero3, _ = (at(model, kw) for model, kw in SETUPS)
    assert single.statics.step_temp > 0 and single.statics.autocast_copies > 0
    assert single.statics.step_temp != single.statics.step_grads
    forward = named(single.rows["forward"])
    assert len({forward.gradients, forward.activations, forward.autocast_copies, forward.logits_loss}) == 4
    assert zero3.statics.gathered > 0 and zero3.statics.gathered_at_loss > 0
    start = named(zero3.rows["backward_start"])
    assert len({start.gradients, start.activations, start.logits_loss, start.parallel_buffers}) == 4


@pytest.mark.parametrize(("model", "kw"), SETUPS)
def test_components_by_name_add_up_to_the_instant_total(model, kw) -> None:
    m = at(model, kw)
    for instant, row in m.rows.items():
        components = components_of(m.statics, row)
        assert list(components)[-len(STEP_COMPONENTS):] == list(STEP_COMPONENTS)
        assert sum(components.values()) == m.total(instant)
        assert [components[c] for c in STEP_COMPONENTS] == list(row)


def test_the_heads_cast_is_gone_by_the_top_layers_backward() -> None:
    # PEFT QLoRA, bf16-mixed, checkpointing: the fp32 lm_head (prepare_model_for_kbit_training) is cast to
    # bf16 under autocast and the cast saved for the head's input gradient, 151,936 x 896 x 2 B on
    # Qwen2.5-0.5B (tied: the embedding's fp32 weight); the head's backward releases it before the top
    # layer's backward starts
    m = at("Qwen/Qwen2.5-0.5B", {"method": "qlora", "precision": "bf16-mixed", "gradient_checkpointing": True,
                                  "batch": 1, "seq": 1024})
    assert named(m.rows["backward_start"]).autocast_copies == 151_936 * 896 * 2
    assert named(m.rows["backward_layers_top"]).autocast_copies == 0
