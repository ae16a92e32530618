"""FSDP2's bottom layer beside the prefetched embedding group (estimator/wrappers/fully_shard.py
``embedding_prefetch``), by hand from torch 2.13's _fully_shard on a three-layer Qwen2.5-72B whose bottom
layer a two-layer freeze run leaves frozen, parameters offloaded (``CPUOffloadPolicy``), and its attention
core's moment (estimator/wrapper_rows.py ``bottom_attention_row``)."""

from __future__ import annotations

import sys
from pathlib import Path

from tuneplan.api import build_setup
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run
from tuneplan.specs.model import model_from_config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from random_setups import reduced_model  # noqa: E402

QWEN25_72B_3L = {"model_type": "qwen2", "hidden_size": 8192, "num_hidden_layers": 3,
                 "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 29568,
                 "vocab_size": 152064,
                 "tie_word_embeddings": False}
H, KV, FF, VOCAB = 8_192, 1_024, 29_568, 152_064
LAYER = (H * H + H) + 2 * (H * KV + KV) + H * H + 3 * H * FF + 2 * H  # q (bias), k, v (biases), o, MLP, norms
EMBED = VOCAB * H


def statics(offload: str, trained: int):  # type: ignore[no-untyped-def]
    model = model_from_config(QWEN25_72B_3L, "Qwen2.5-72B 3 layers (hand config)")
    setup = build_setup(model, method="freeze", precision="bf16-mixed", gpus=2, fsdp=True, fsdp_version=2,
                        offload=offload, freeze_trainable_layers=trained, gradient_checkpointing=True,
                        batch=1, seq=64, framework="llamafactory")
    return memory_statics(resolve_run(model, setup))


def test_the_embedding_prefetch_copies_its_host_shard_to_the_device() -> None:
    # layer 0 unsharded (prefetched by layer 1), layer 1's reduce-scatter input, the embedding group's flat
    # all-gather output and its all-gather input, the host shard copied to the device (bf16 each)
    assert LAYER == 877_684_736
    on_host, on_device = statics("all", 2), statics("none", 2)
    assert on_host.gathered_bottom_backward == 2 * LAYER + 2 * EMBED + 2 * LAYER + EMBED
    assert on_device.gathered_bottom_backward == 2 * LAYER + 2 * EMBED + 2 * LAYER


def test_a_frozen_bottom_layer_makes_no_gradient_of_its_own() -> None:
    # below the two trained layers: no unsharded gradient of layer 0, its activations not freed by one;
    # with all three layers trained it makes a layer's (the reduce-scatter input, in bf16)
    frozen, trained = statics("all", 2), statics("all", 3)
    assert not frozen.wrapped.bottom_layer_trains and trained.wrapped.bottom_layer_trains
    assert frozen.bottom_layer_grads == frozen.grads
    assert trained.bottom_layer_grads == trained.grads + 2 * LAYER


def test_under_checkpointing_the_host_copy_comes_before_the_recomputation() -> None:
    # the embedding's prefetch runs at the bottom layer's pre-backward, before its checkpoint is recomputed
    # (the FSDP2 pre-backward hook fires on the layer's output gradient; the recomputation runs when its
    # first saved tensor is unpacked), and the copy is dropped once the all-gather is filled: the row holds
    # the larger of that moment and the recomputed layer with its scratch, beside the rest
    from tuneplan.estimator.instants import memory_at, named

    model = model_from_config(QWEN25_72B_3L, "Qwen2.5-72B 3 layers (hand config)")
    for tokens in (64, 4096):
        setup = build_setup(model, method="freeze", precision="bf16-mixed", gpus=2, fsdp=True,
                            fsdp_version=2, offload="all", freeze_trainable_layers=2,
                            gradient_checkpointing=True, batch=1, seq=tokens, framework="llamafactory")
        row = named(memory_at(resolve_run(model, setup), 1, tokens).rows["backward_bottom_layer"])
        rest = 2 * LAYER + 2 * EMBED + 2 * LAYER  # as on the device, without the host shard's copy
        assert row.parallel_buffers == rest + max(EMBED - row.activations - row.backward_temp, 0)


def test_a_freeze_run_misses_only_its_lowest_trained_layers_shard() -> None:
    # torch 2.13 FSDPParamGroup.post_backward: a layer's fp32 shard (accelerate's upcast) is made by its
    # foreach_reduce once its backward ends. Two of three layers trained: the row nearest the bottom is
    # layer 1's backward (layer 0 frozen, no gradient of its own), where layer 2's shard (LAYER x 4 / 2)
    # is made and layer 1's unsharded bf16 gradients (LAYER x 2) are live; only layer 1's shard is missing.
    # All three trained: the second layer's backward, layers 0 and 1 missing, layer 2's made: the same sum.
    assert statics("none", 2).all_grads_in_layer == LAYER * 4 // 2 + LAYER * 2
    assert statics("none", 3).all_grads_in_layer == LAYER * 4 // 2 + LAYER * 2
    # under CPUOffloadPolicy the shards go to the host: only the unsharded gradients are on the device
    assert statics("all", 2).all_grads_in_layer == LAYER * 2


def test_without_checkpointing_the_host_copy_is_freed_before_the_layers_gradients() -> None:
    # two layers, both trained, no checkpointing (simulate: 7,801,551,872 B at layer 0's backward, bf16 over
    # 2 GPUs, b1 x 128): the embedding's host shard (EMBED x 2 B / 2 GPUs) is copied to the device at layer
    # 0's pre-backward, beside its few activations only, and freed once the flat all-gather output is filled;
    # layer 0's bf16 weight gradients (LAYER x 2 B = 1.76 GB, more than the 1.25 GB copy) come after it.
    # At the row: layer 0 unsharded, layer 1's reduce-scatter input, the embedding's flat output, no copy.
    from tuneplan.estimator.instants import memory_at, named

    model = model_from_config({**QWEN25_72B_3L, "num_hidden_layers": 2}, "Qwen2.5-72B 2 layers (hand config)")
    setup = build_setup(model, method="freeze", precision="bf16", gpus=2, fsdp=True, fsdp_version=2,
                        offload="all", freeze_trainable_layers=2, gradient_checkpointing=False, batch=1,
                        seq=128, framework="llamafactory", optimizer="adamw-8bit", attn="eager")
    row = named(memory_at(resolve_run(model, setup), 1, 128).rows["backward_bottom_layer"])
    assert row.parallel_buffers == 2 * LAYER + 2 * EMBED + 2 * LAYER
    assert row.gradients == 2 * LAYER


def test_the_bottom_layer_at_its_attention_core_beside_the_prefetched_embedding() -> None:
    # Qwen2.5-32B at two layers, freeze of both, bf16, CPU offload, checkpointed, eager, b1 x 2048 over 4
    # GPUs (simulate: the peak at layer 0's _softmax_backward_data, 6,654,386,176 B). Layer 0 (recomputed)
    # has made its MLP's gate / up / down (5120 x 27648 each) and o_proj (5120 x 5120) bf16 gradients, not
    # its q / k / v ones; beside it: layer 0 unsharded, layer 1's reduce-scatter input, the embedding's
    # flat all-gather output (152064 x 5120), all in bf16; its host shard's copy is freed by then.
    from tuneplan.estimator.instants import memory_at, named

    h, kv, ff, vocab = 5120, 1024, 27648, 152064
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * ff + 2 * h
    assert layer == 487_605_248
    spec = reduced_model("Qwen/Qwen2.5-32B", 2)
    setup = build_setup(spec, method="freeze", precision="bf16", framework="hf", batch=1, seq=2048,
                        gradient_checkpointing=True, optimizer="sgd", attn="eager", gpus=4, fsdp=True,
                        fsdp_version=2, offload="all")
    rows = memory_at(resolve_run(spec, setup), 1, 2048).rows
    row = named(rows["backward_bottom_attention"])
    assert row.gradients == (3 * h * ff + h * h) * 2 == 901_775_360
    assert row.parallel_buffers == 2 * layer + 2 * vocab * h + 2 * layer
