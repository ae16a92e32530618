"""What ZeRO-3 keeps of the top decoder layer once the output head's two fetches put it past
``stage3_max_reuse_distance``, counted by hand from DeepSpeed 0.19.8's PartitionedParameterCoordinator
(``__params_to_release``: the reuse walk; ``_fetch_sub_module_impl``: the prefetcher's record of a skipped
AVAILABLE parameter) and transformers 5.25 / PEFT's module order; estimator/wrappers/zero3_head_reuse.py."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.wrappers.zero3_coordinator import zero3_kept_params, zero3_layers_kept
from tuneplan.estimator.wrappers.zero3_head_reuse import (
    zero3_leaf_block_kept,
    zero3_recorded_at_loss,
    zero3_recorded_unreleased,
)
from tuneplan.specs.model import model_from_config

M = 1_000_000_000  # stage3_max_live_parameters and stage3_max_reuse_distance, DeepSpeed's defaults


def test_the_head_counted_twice_keeps_no_layer_and_the_prefetcher_records_the_top_one() -> None:
    # Qwen2.5-32B widths, 2 layers, freeze (top layer trained), no checkpointing: head V h = 152,064 x
    # 5,120 = 778,567,680, fetched by its forward and its backward: 1,557,135,360 >= D, nothing kept by
    # the distance. At the top layer's forward the head and the layer are gathered; its releases bring
    # the count under M at gate_proj (778.6e6 + 487.6e6 - q, k, v, o, gate < 1e9), and the prefetcher
    # pops the head's backward use, then down_proj (still gathered: recorded), up_proj (released: gathered
    # again): 778,567,680 + 141,557,760 = 920,125,440 < M, + 141,557,760 = 1,061,683,200 >= M, the last
    # pop (simulate: 1.0617e9 elements at the loss, down_proj never released, up_proj gathered again).
    h, f, v = 5120, 27648, 152064
    cfg = dict(model_type="qwen2", hidden_size=h, num_hidden_layers=2, num_attention_heads=40,
               num_key_value_heads=8, head_dim=128, intermediate_size=f, vocab_size=v,
               tie_word_embeddings=False)
    spec = model_from_config(cfg, "qwen2.5-32b-2L")
    head, mlp = v * h, h * f
    assert spec.lm_head_params == head
    assert zero3_layers_kept(spec, head) == 0
    freeze = build_setup(spec, method="freeze", gpus=2, zero=3, gradient_checkpointing=False)
    assert zero3_kept_params(spec, freeze, head, frozenset()) == 0
    assert zero3_recorded_at_loss(spec, freeze, frozenset(), head, 0) == head + 2 * mlp == 1_061_683_200
    # a layer kept by the distance is what the loss holds: no record walk
    assert zero3_recorded_at_loss(spec, freeze, frozenset(), head, 1) == 0
    # under checkpointing the recompute fetches the top layer in forward order: q 26,214,400, k and v
    # 5,242,880, o 26,214,400, with q, k, v's biases (5,120 + 2 x 1,024, counted with their linears as
    # zero3_coordinator.forward_trace does): 841,489,408; + gate 983,047,168 < M; + up crosses
    ckpt = build_setup(spec, method="freeze", gpus=2, zero=3, gradient_checkpointing=True)
    attn = 2 * h * h + 2 * h * 1024 + h + 2 * 1024
    assert zero3_recorded_at_loss(spec, ckpt, frozenset(), head, 0) == head + attn + 2 * mlp


def test_falcon_lora_the_recorded_weight_is_never_released_so_no_view_holds_it() -> None:
    # falcon-40b widths, 2 layers, LoRA r 32 on the MLP, no checkpointing. The tied head (the embedding,
    # V h = 532,676,608) twice is past D. The top layer in forward order: qkv 75,497,472, dense
    # 67,108,864, dense_h_to_4h's lora_A 262,144, weight 268,435,456, lora_B 1,048,576, dense_4h_to_h's
    # lora_A 1,048,576, weight 268,435,456, lora_B 262,144. Gathered with the head: 1,214,775,296; the
    # releases bring the count under M at dense_h_to_4h's weight (1,071,906,816 - 268,435,456). The
    # prefetcher then pops, from the last: 4h_to_h lora_B, weight (still gathered: recorded), lora_A,
    # h_to_4h lora_B, weight (released: gathered again), which brings it to 1,071,906,816 >= M.
    # (simulate: 1.0723e9 at the loss with the persistent norms; dense_4h_to_h never released,
    # dense_h_to_4h released and gathered again.)
    h, kv, v = 8192, 8, 65024
    cfg = dict(model_type="falcon", hidden_size=h, num_hidden_layers=2, num_attention_heads=128,
               num_kv_heads=kv, new_decoder_architecture=True, parallel_attn=True, bias=False,
               multi_query=True, alibi=False, vocab_size=v)
    spec = model_from_config(cfg, "falcon-40b-2L")
    head, up, r = v * h, 4 * h * h, 32
    assert zero3_layers_kept(spec, head) == 0
    lora = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=False, rank=r)
    targets = frozenset({"dense_h_to_4h", "dense_4h_to_h"})
    expected = head + (r * h) + up + (4 * h * r) + (r * 4 * h) + up
    assert expected == 1_071_906_816
    assert zero3_recorded_at_loss(spec, lora, targets, head, 0) == expected
    assert zero3_recorded_unreleased(spec, lora, targets, head, 0) == up


def test_a_leaf_moe_block_is_kept_by_the_wrapper_backward_fetch_after_the_head() -> None:
    # Qwen2-57B-A14B widths, 4 layers: the head 151,936 x 3,584 = 544,538,624, twice past D. The MoE
    # block is a ZeRO-3 leaf: the reuse walk lists the causal-LM model's whole subtree at its backward
    # fetch, right after the head's forward: final norm 3,584 + head < D, the top block kept (router
    # 64 x 3,584 = 229,376, experts 64 x 3 x 3,584 x 2,560 = 1,761,607,680, shared expert 3 x 3,584 x
    # 20,480 = 220,200,960, its gate 3,584: 1,982,041,600; simulate: the top block not released after its
    # forward, the attention's linears released, 2.5266e9 elements at the loss with the head).
    h, v = 3584, 151936
    cfg = dict(model_type="qwen2_moe", hidden_size=h, num_hidden_layers=4, num_attention_heads=28,
               num_key_value_heads=4, intermediate_size=18944, moe_intermediate_size=2560,
               shared_expert_intermediate_size=20480, num_experts=64, num_experts_per_tok=8,
               vocab_size=v, tie_word_embeddings=False)
    spec = model_from_config(cfg, "qwen2-57b-a14b-4L")
    head = v * h
    assert zero3_layers_kept(spec, head) == 0
    full = build_setup(spec, method="full", gpus=8, zero=3, gradient_checkpointing=False)
    block = 64 * h + 64 * 3 * h * 2560 + 3 * h * 20480 + h
    assert block == 1_982_041_600
    assert zero3_leaf_block_kept(spec, full, head) == block
    assert zero3_kept_params(spec, full, head, frozenset()) == block
    assert zero3_recorded_at_loss(spec, full, frozenset(), head, 0) == 0
    # a dense model of the same widths has no leaf block
    dense = model_from_config(dict(cfg, model_type="qwen2"), "qwen2-dense-4L")
    assert zero3_leaf_block_kept(dense, build_setup(dense, method="full", gpus=8, zero=3), head) == 0
