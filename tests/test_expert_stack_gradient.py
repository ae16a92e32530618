"""A trained layer's largest new weight gradient beside its accumulated buffer
(estimator/memory_statics.new_weight_gradient_temp), by hand: a dense linear's, or a fused routed-expert
stack's in transformers 5's Qwen3-MoE (``Qwen3MoeExperts``: ``gate_up_proj`` of E x 2f x h, ``down_proj``
of E x h x f, multiplied by ``torch._grouped_mm``, whose backward returns the whole stack's weight
gradient)."""

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
    assert statics.new_grad_temp == 2 * GATE_UP  # bf16 gradients
    rows = memory_at(run, 1, 64).rows
    assert named(rows["backward_layers_top"]).backward_temp >= 2 * GATE_UP


def test_no_buffer_no_transformers_code_or_a_wrapper_that_moves_gradients_out_holds_none() -> None:
    # GA = 1: the new gradient becomes .grad (AccumulateGrad steals it); ZeRO-2 moves each gradient into
    # its bucket at the hook
    for kw in ({"grad_accum": 1}, {"grad_accum": 2, "gpus": 4, "zero": 2}):
        assert _statics(**kw)[1].new_grad_temp == 0, kw
    # torchtune runs its own MoE code, one tensor per expert (128 x 256): its largest weight is q_proj's or
    # o_proj's, 256 x 256, in bf16
    assert _statics(grad_accum=2, framework="torchtune")[1].new_grad_temp == 2 * 256 * 256
    assert _statics(grad_accum=2, gpus=4, zero=1)[1].new_grad_temp == 2 * GATE_UP  # ZeRO-1 keeps .grad


def test_a_dense_layers_largest_weight_gradient_beside_its_buffer() -> None:
    # Llama-2-13b (h 5120, MLP 13824) freeze of its two layers, fp32, two micro-batches: down_proj's new
    # 5120 x 13824 fp32 gradient, 283,115,520 B, beside every accumulated buffer (simulate: the peak at that
    # mm in the second micro-batch's backward)
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from random_setups import reduced_model

    spec = reduced_model("meta-llama/Llama-2-13b-hf", 2)
    run = resolve_run(spec, build_setup(spec, method="freeze", precision="fp32", batch=1, seq=128,
                                        grad_accum=2, gradient_checkpointing=False, attn="sdpa"))
    assert memory_statics(run).new_grad_temp == 5120 * 13824 * 4 == 283_115_520
