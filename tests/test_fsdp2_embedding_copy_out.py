"""FSDP2 (torch 2.13 ``_fully_shard``) at an untied, frozen token embedding, and ``no_sync`` accumulation
under ``CPUOffloadPolicy``. Sizes by hand from the models' shapes and the framework code:

- ``FSDPParamGroup.wait_for_unshard`` copies a group's flat all-gather output into its unsharded parameters
  and drops the flat output only when the copy-out returns: the embedding group's copy-out holds both, in
  the forward and, when transformers' ``gradient_checkpointing_enable`` made the embedding's output require
  grad (``enable_input_require_grads``), again at its ``pre_backward`` after the bottom layer's backward.
- ``set_requires_gradient_sync(False)`` (the Trainer's ``no_sync`` while accumulating) keeps each trainable
  parameter's unsharded gradient on the device, offloaded parameters or not."""

from __future__ import annotations

import sys
from pathlib import Path

from tuneplan.api import build_setup, resolve_run
from tuneplan.estimator.instants import memory_at, named

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from random_setups import reduced_model  # noqa: E402

# Qwen3-4B: vocab 151936 x hidden 2560; with a classifier head the embeddings are a group of their own
QWEN3_4B_EMBED16 = 151936 * 2560 * 2  # gathered in the bf16 MixedPrecisionPolicy param dtype
# Llama-3.2-3B layer: q and o 3072 x 3072, k and v 3072 x 1024, gate/up/down 3072 x 8192, two norms of 3072
LLAMA32_3B_LAYER = 2 * 3072 * 3072 + 2 * 3072 * 1024 + 3 * 3072 * 8192 + 2 * 3072


def qlora_classifier(gc: bool):
    spec = reduced_model("Qwen/Qwen3-4B", 3)
    run = resolve_run(spec, build_setup(spec, method="qlora", precision="bf16-mixed", batch=1, seq=512,
                                        gpus=2, fsdp=True, fsdp_version=2, num_labels=2, targets="mlp",
                                        rank=64, gradient_checkpointing=gc))
    return memory_at(run, 1, 512)


def test_the_embeddings_own_copy_out_holds_their_flat_output_and_parameters() -> None:
    m = qlora_classifier(gc=True)
    assert QWEN3_4B_EMBED16 == 777_912_320
    # 4-bit layers are far smaller than the embeddings: their copy-out is the bottom of the forward
    assert named(m.rows["forward_layers_bottom"]).parallel_buffers == 2 * QWEN3_4B_EMBED16


def test_a_frozen_embedding_whose_output_requires_grad_copies_out_in_the_backward() -> None:
    with_gc, without = qlora_classifier(gc=True), qlora_classifier(gc=False)
    assert named(with_gc.rows["backward_embedding"]).parallel_buffers == 2 * QWEN3_4B_EMBED16
    # no checkpointing: the embedding's output does not require grad, its pre-backward never runs
    assert "backward_embedding" not in without.rows


def test_no_sync_keeps_unsharded_gradients_on_the_device_under_cpu_offload() -> None:
    """Freeze, fp32, the top two of four layers trainable, two micro-batches: the second forward starts with
    the first one's unsharded fp32 gradients (simulate: 805,355,520 B of them, ``model.layers.2-3``)."""
    spec = reduced_model("meta-llama/Llama-3.2-3B-Instruct", 4)
    run = resolve_run(spec, build_setup(spec, method="freeze", precision="fp32", framework="llamafactory",
                                        batch=3, seq=384, grad_accum=2, gradient_checkpointing=True, gpus=2,
                                        fsdp=True, fsdp_version=2, offload="all"))
    m = memory_at(run, 3, 384)
    assert LLAMA32_3B_LAYER == 100_669_440
    assert named(m.rows["forward_layers_bottom"]).gradients == 2 * LLAMA32_3B_LAYER * 4
    # the synced shards are copied to the host: nothing on the device at the optimizer step
    assert named(m.rows["optimizer_step"]).gradients == 0


def test_a_frozen_bottom_layer_drops_the_reduce_scatter_input_before_the_embeddings_copy_out() -> None:
    """Freeze of the top 2 of 3 layers, fp16-mixed, checkpointed (simulate: 6,901,885,952 B at the
    embedding's copy-out, no reduce-scatter buffer live). Frozen layer 0's ``post_backward`` fires on its
    input's gradient, before the embedding's ``pre_backward``: it drops layer 1's reduce-scatter input (the
    oldest beyond ``reduce_scatter_max_input_buffers`` = 1) and, with no gradient, reduces nothing. Left:
    the two trained layers' fp32 shards (4 B / 2 GPUs per parameter), the embedding's flat all-gather
    output and its unsharded copy (128256 x 4096 in fp16 each)."""
    layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    spec = reduced_model("meta-llama/Llama-3.1-8B", 3)
    run = resolve_run(spec, build_setup(spec, method="freeze", precision="fp16-mixed", batch=2, seq=256,
                                        gradient_checkpointing=True, attn="sdpa", gpus=2, fsdp=True,
                                        fsdp_version=2))
    row = named(memory_at(run, 2, 256).rows["backward_embedding"])
    assert row.gradients == 2 * layer * 4 // 2 == 872_448_000
    assert row.parallel_buffers == 2 * 128256 * 4096 * 2
