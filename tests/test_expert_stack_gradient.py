"""A fused routed-expert stack's new weight gradient beside its accumulated buffer
(estimator/memory_statics.expert_stack_gradient_temp), by hand from transformers 5's Qwen3-MoE
(``Qwen3MoeExperts``: ``gate_up_proj`` of E x 2f x h, ``down_proj`` of E x h x f, multiplied by
``torch._grouped_mm``, whose backward returns the whole stack's weight gradient)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.instants import memory_at, named
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run
from tuneplan.specs.model import model_from_config

MINI_QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512,
                  "moe_intermediate_size": 128, "num_experts": 16, "num_experts_per_tok": 2,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                  "vocab_size": 1000, "tie_word_embeddings": False}
GATE_UP = 16 * (2 * 128) * 256  # E x 2f x h elements, the larger of the two stacks (down: E x h x f)


def _statics(**kw):  # type: ignore[no-untyped-def]
    model = model_from_config(MINI_QWEN3_MOE, "mini Qwen3-MoE (hand config)")
    run = resolve_run(model, build_setup(model, method="freeze", precision="bf16", batch=1, seq=64, **kw))
    return run, memory_statics(run)


def test_an_accumulating_micro_batch_holds_the_gate_up_stack_gradient_beside_its_buffer() -> None:
    run, statics = _statics(grad_accum=2)
    assert statics.expert_grad_temp == 2 * GATE_UP  # bf16 gradients
    rows = memory_at(run, 1, 64).rows
    assert named(rows["backward_layers_top"]).backward_temp >= 2 * GATE_UP


def test_no_buffer_no_transformers_code_or_a_wrapper_that_moves_gradients_out_holds_none() -> None:
    # GA = 1: the new gradient becomes .grad (AccumulateGrad steals it); ZeRO-2 moves each gradient into
    # its bucket at the hook; torchtune runs its own MoE code
    for kw in ({"grad_accum": 1}, {"grad_accum": 2, "gpus": 4, "zero": 2},
               {"grad_accum": 2, "framework": "torchtune"}):
        assert _statics(**kw)[1].expert_grad_temp == 0, kw
    assert _statics(grad_accum=2, gpus=4, zero=1)[1].expert_grad_temp == 2 * GATE_UP  # ZeRO-1 keeps .grad
