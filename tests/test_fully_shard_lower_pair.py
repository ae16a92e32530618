"""FSDP2's lower trained layer and the layer below it that it prefetched, each at its own size
(estimator/wrappers/fully_shard.py ``lower_layers_gathered``), by hand from torch 2.13's _fully_shard
(``FSDPParamGroup._backward_prefetch``) on a five-layer DeepSeek-V3-shaped model whose first three layers
are dense (``first_k_dense_replace``) and whose top two are MoE."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run
from tuneplan.specs.model import model_from_config

CFG = {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 5, "num_attention_heads": 4,
       "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
       "qk_rope_head_dim": 4, "v_head_dim": 8, "intermediate_size": 128, "moe_intermediate_size": 16,
       "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 3,
       "vocab_size": 100, "tie_word_embeddings": False}
H = 64
# MLA: q_a (h x 32), q_a_layernorm (32), q_b (32 x 4 heads x 12), kv_a_proj_with_mqa (h x (16 + 4)),
# kv_a_layernorm (16), kv_b (16 x 4 heads x (8 + 8)), o_proj (4 x 8 x h)
ATTN = H * 32 + 32 + 32 * 4 * 12 + H * 20 + 16 + 16 * 4 * 16 + 4 * 8 * H
DENSE = ATTN + 3 * H * 128 + 2 * H  # gated MLP h -> 128 -> h, two RMSNorms
MOE = ATTN + 8 * H + 8 * 3 * H * 16 + 3 * H * 16 + 2 * H  # router, 8 experts, 1 shared expert, norms


def gathered(trained: int) -> int:
    model = model_from_config(CFG, "DeepSeek-V3 shape, 5 layers (hand config)")
    setup = build_setup(model, method="freeze", precision="bf16-mixed", gpus=8, fsdp=True, fsdp_version=2,
                        offload="all", freeze_trainable_layers=trained, batch=4, seq=256, framework="hf")
    return memory_statics(resolve_run(model, setup)).gathered


def test_the_frozen_dense_layer_below_the_trained_moe_layers_is_prefetched_at_its_own_size() -> None:
    # two MoE layers trained (3, 4): the lowest trained layer 3 is back-propagated beside the frozen dense
    # layer 2 its pre-backward prefetched and layer 4's reduce-scatter input (its bf16 gradients), all bf16
    assert (DENSE, MOE) == (32_688, 36_272)
    assert gathered(2) == 2 * MOE + 2 * DENSE + 2 * MOE


def test_with_every_layer_trained_the_pair_is_bounded_by_the_largest_layer() -> None:
    # every layer trained: the row bounds any layer's backward, two MoE layers unsharded beside one's grads
    assert gathered(5) == 2 * MOE + 2 * MOE + 2 * MOE
