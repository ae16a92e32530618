"""FSDP2 (torch 2.13 ``_fully_shard``) near the bottom and at the end of the backward. Sizes by hand from the
models' shapes and the framework code:

- ``FSDPParamGroup._backward_prefetch``: the bottom layer's pre-backward all-gathers the group before it in
  ``comm_ctx.post_forward_order``, the untied embedding group, into one flat buffer in the param dtype; with
  a frozen embedding whose output does not require grad the group never copies it out, and the buffer stays
  until the root's final callback (``finalize_backward``). Beside it: the bottom layer unsharded, the layer
  above's reduce-scatter input (``comm_ctx.reduce_scatter_state``), the layer above's shard, and, at the
  layer's end, its own unsharded gradients (its activations released).
- ``set_requires_gradient_sync(False)`` accumulation (the Trainer's ``no_sync``): in the micro-batch that
  syncs, each group's post-backward reduce-scatters its accumulated gradient as the backward reaches it;
  at the tied embedding's backward only the tied tail (reduced in the final callback) still holds its
  accumulated unsharded gradient, beside the head's new gradient, the embedding's and their sum."""

from __future__ import annotations

import sys
from pathlib import Path

from tuneplan.api import build_setup, resolve_run
from tuneplan.estimator.instants import memory_at, named

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from random_setups import reduced_model  # noqa: E402

# TinyLlama-1.1B: vocab 32000 x hidden 2048; a layer: q and o 2048 x 2048, k and v 2048 x 256,
# gate/up/down 2048 x 5632, two norms of 2048
TINYLLAMA_EMBED = 32000 * 2048
TINYLLAMA_LAYER = 2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 5632 + 2 * 2048
# gpt2: wte 50257 x 768 (tied), wpe 1024 x 768, ln_f 2 x 768; a layer: ln_1, c_attn 768 x 2304 + bias,
# c_proj 768 x 768 + bias, ln_2, c_fc 768 x 3072 + bias, c_proj 3072 x 768 + bias
GPT2_TAIL = 50257 * 768 + 2 * 768
GPT2_LAYER = 2 * 768 + 768 * 2304 + 2304 + 768 * 768 + 768 + 2 * 768 + 768 * 3072 + 3072 + 3072 * 768 + 768
GPT2_3L = GPT2_TAIL + 1024 * 768 + 3 * GPT2_LAYER


def test_the_bottom_layer_holds_the_prefetched_embedding_group() -> None:
    """fp32 freeze, both layers trainable (simulate: 614,498,304 B of parallel buffers at the peak)."""
    spec = reduced_model("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", 2)
    run = resolve_run(spec, build_setup(spec, method="freeze", precision="fp32", batch=3, seq=64,
                                        optimizer="paged-adamw", attn="eager", gpus=2, fsdp=True,
                                        fsdp_version=2))
    row = named(memory_at(run, 3, 64).rows["backward_bottom_layer"])
    assert TINYLLAMA_LAYER == 44_044_288
    # the bottom layer unsharded, the flat embedding buffer, the top layer's reduce-scatter input
    assert row.parallel_buffers == (TINYLLAMA_LAYER + TINYLLAMA_EMBED + TINYLLAMA_LAYER) * 4 == 614_498_304
    # the top layer's shard and the bottom layer's unsharded gradients; no activation of it left
    assert row.gradients == TINYLLAMA_LAYER * 4 // 2 + TINYLLAMA_LAYER * 4
    assert row.activations < TINYLLAMA_LAYER * 4 // 100


def test_the_synced_micro_batch_ends_with_only_the_tied_tail_accumulated() -> None:
    """Pure bf16 without accelerate's mixed precision (LLaMA-Factory's pure_bf16: bf16 parameters, no fp32
    upcast), two micro-batches, 4 GPUs (simulate: 308,779,008 B of tail-sized gradients at the peak,
    10,632,192 B of layer shards)."""
    spec = reduced_model("openai-community/gpt2", 3)
    run = resolve_run(spec, build_setup(spec, method="full", precision="bf16", framework="llamafactory",
                                        batch=1, seq=64, grad_accum=2,
                                        gradient_checkpointing=False, optimizer="adamw-hf", attn="flash",
                                        gpus=4, fsdp=True, fsdp_version=2))
    row = named(memory_at(run, 1, 64).rows["backward_embedding"])
    assert GPT2_3L == 60_648_960
    wte16, wpe16 = 50257 * 768 * 2, 1024 * 768 * 2
    # the layers' shards; the tail's (and the root group's position table's) accumulated unsharded gradient,
    # reduced only in the final callback; the head's new gradient, the embedding's and their sum; the bottom
    # layer's reduce-scatter input
    hand = 3 * GPT2_LAYER * 2 // 4 + GPT2_TAIL * 2 + wpe16 + 3 * wte16 + GPT2_LAYER * 2
    assert hand == 335_162_496
    # the model spec's embedding counts the position table with the token table: its three new copies too
    assert 0 <= row.gradients - hand <= 3 * wpe16


def test_a_frozen_bottom_layer_not_back_propagated_prefetches_no_embedding() -> None:
    # freeze of the top 2 of Llama-2-70b's 4 layers, fp32, CPU offload, 2 GPUs, no checkpointing: autograd's
    # backward ends at layer 2 (layers 0 and 1 and the embedding output need no gradient), so layer 0's
    # pre-backward, the one that would prefetch the embedding group, never runs. The backward's unsharded
    # buffers peak at layer 2 beside the frozen layer 1 it prefetched and layer 3's reduce-scatter input:
    # 3 x LAYER x 4 B, never the embedding's 32000 x 8192 x 4 B flat buffer (simulate: gemma-3-27b-it freeze
    # of 2 of 4 layers, 2 GPUs: the backward's peak 4.7 GB under the forward's embedding copy-out)
    h, w, kv = 8192, 28672, 1024
    layer = 2 * h * h + 2 * kv * h + 3 * w * h + 2 * h
    spec = reduced_model("meta-llama/Llama-2-70b-hf", 4)
    base = dict(method="freeze", precision="fp32", framework="hf", grad_accum=1, optimizer="adamw-hf", gpus=2,
                fsdp=True, fsdp_version=2, offload="all", batch=1, seq=256)
    rows = memory_at(resolve_run(spec, build_setup(spec, **base)), 1, 256).rows
    assert "backward_bottom_layer" not in rows
    backward = [named(v).parallel_buffers for k, v in rows.items() if k.startswith("backward")]
    assert max(backward) == 3 * layer * 4
    # checkpointed under the HF Trainer the embedding's output requires grad: the frozen layers are
    # back-propagated and layer 0 prefetches the embedding group (its flat fp32 buffer among the gathered)
    rows = memory_at(resolve_run(spec, build_setup(spec, **base, gradient_checkpointing=True)), 1, 256).rows
    assert named(rows["backward_bottom_layer"]).parallel_buffers > 32_000 * h * 4
