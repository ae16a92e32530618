"""ZeRO-3 weights a checkpoint's recompute leaves to Falcon's saved ``weight.T`` views, counted by hand from
DeepSpeed 0.19.8's coordinator (``update_recompute_parameters``, ``release_sub_module``) and transformers'
``FalconLinear`` (estimator/wrappers/zero3_recompute_views.py)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.instants import memory_at
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_recompute_views import (
    recompute_views_apply,
    replay_with_views,
    zero3_recompute_views_lower,
)
from tuneplan.estimator.wrappers.zero3_replay import Module, Param
from tuneplan.specs.model import model_from_config

H, KV_HEADS, HEAD_DIM, VOCAB = 8192, 8, 64, 65024
FALCON_40B_4L = dict(model_type="falcon", hidden_size=H, num_hidden_layers=4, num_attention_heads=128,
                     num_kv_heads=KV_HEADS, new_decoder_architecture=True, parallel_attn=True, bias=False,
                     alibi=False, vocab_size=VOCAB, tie_word_embeddings=True)
QKV = H * (H + 2 * KV_HEADS * HEAD_DIM)  # 75,497,472
DENSE = H * H  # 67,108,864
UP = DOWN = 4 * H * H  # 268,435,456


def test_a_released_recomputed_weight_lives_on_in_its_view_until_its_backward() -> None:
    # the MLP's lora_B runs its backward (owner); the recompute fetches the frozen weight w (2e8, one byte
    # an element), filed under the owner (update_recompute_parameters); w's recompute release keeps it
    # (active under the owner); the owner's release frees it in the coordinator, but the saved weight.T
    # view keeps its storage: still 2e8. w's backward fetch gathers a second copy: 4e8. Its backward
    # consumes the view and its release frees the copy: 0. No prefetch (a bucket of 0).
    w = Param(200_000_000, 1)
    owner, linear = Module(), Module([w])
    events = [("fetch", owner, "B"), ("fetch", linear, "R"), ("release", linear, "R"),
              ("release", owner, "B"), ("fetch", linear, "B"), ("release", linear, "B")]
    assert replay_with_views(events, 0, {id(w)}) == [0, 200_000_000, 200_000_000, 200_000_000,
                                                     400_000_000, 0]
    # a weight without a view (nn.Linear under zero3_linear_wrap saves the parameter itself): freed
    assert replay_with_views(events, 0, set()) == [0, 200_000_000, 200_000_000, 0, 200_000_000, 0]


def test_falcon_lora_lower_layers_hold_the_recomputed_layer_beside_the_rounds() -> None:
    # falcon-40b over 4 layers, LoRA rank 64 on every linear with checkpointing, fp32, LLaMA-Factory over
    # 8 GPUs. LoRA factors per layer: qkv 64 H + 9216 x 64 = 1,114,112, dense 2 x 64 H = 1,048,576,
    # h_to_4h and 4h_to_h 64 H + 64 x 4H = 2,621,440 each: 7,405,568.
    # At layer 1's dense_4h_to_h backward fetch the coordinator holds layer 0 whole, its linears
    # 679,477,248 and factors 7,405,568, in the rounds the prefetcher popped, the embedding 532,676,608
    # popped alone, layer 1's regathered dense_4h_to_h 268,435,456 and its factors but 4h_to_h's lora_B
    # (released with its backward module) 6,881,280: 1,494,876,160 elements. Layer 1's recompute fetched
    # its four weights, filed under 4h_to_h's lora_B and released with it; their weight.T views keep them:
    # 679,477,248 more. (1,494,876,160 + 679,477,248) x 4 bytes = 8,697,413,632.
    spec = model_from_config(FALCON_40B_4L, "falcon-40b[4L]")
    setup = build_setup(spec, method="lora", precision="fp32", framework="llamafactory", batch=2, seq=512,
                        grad_accum=2, gradient_checkpointing=True, rank=64, targets="all-linear",
                        gpus=8, zero=3, offload="all")
    run = resolve_run(spec, setup)
    assert recompute_views_apply(run)
    layer = QKV + DENSE + UP + DOWN
    coordinator = layer + 7_405_568 + VOCAB * H + DOWN + 7_405_568 - 64 * H
    assert coordinator == 1_494_876_160
    assert zero3_recompute_views_lower(run, 50_000_000) == (coordinator + layer) * 4 == 8_697_413_632
    # the lower layers' row holds it (the simulation's peak there: 11,410,544,128)
    assert memory_at(run, 2, 512).statics.gathered == 8_697_413_632


def test_qlora_and_unviewed_models_replay_no_views() -> None:
    spec = model_from_config(FALCON_40B_4L, "falcon-40b[4L]")
    qlora = build_setup(spec, method="qlora", gradient_checkpointing=True, gpus=8, zero=3)
    assert not recompute_views_apply(resolve_run(spec, qlora))
    plain = build_setup(spec, method="lora", gradient_checkpointing=False, gpus=8, zero=3)
    assert zero3_recompute_views_lower(resolve_run(spec, plain), 50_000_000) == 0
