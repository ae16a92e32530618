"""FSDP2 (torch 2.13 ``_fully_shard``) in the layers' backward, sizes by hand from the models' shapes and the
framework code:

- after a micro-batch that accumulated unsharded (accelerate's ``no_sync``:
  ``set_requires_gradient_sync(False)``), ``FSDPParamGroup.post_backward`` kept each gradient in
  ``unsharded_param.grad`` (``FSDPParam.to_accumulated_grad_if_needed``: reduce dtype = param dtype), so
  ``AccumulateGrad`` adds each new weight gradient in place: one new weight gradient at a time, not a
  layer's; in the micro-batch that syncs, a group already reduce-scattered has dropped its accumulated
  gradient (``unsharded_param.grad = None``), its shard on the host under ``CPUOffloadPolicy``;
- with two layers the second layer's backward is the top one's: ``comm_ctx.reduce_scatter_state`` holds
  no layer's reduce-scatter input then (only an untied trained tail's)."""

from __future__ import annotations

import sys
from pathlib import Path

from tuneplan.api import build_setup, resolve_run
from tuneplan.estimator.instants import memory_at, named

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from random_setups import reduced_model  # noqa: E402

# Mistral-7B: vocab 32000 x hidden 4096 (untied head), a layer: q and o 4096 x 4096, k and v 4096 x 1024,
# gate/up/down 4096 x 14336, two norms of 4096; the final norm 4096
MISTRAL_LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
MISTRAL_EMBED = 32000 * 4096
MISTRAL_HEAD = 32000 * 4096 + 4096  # the tail group: lm_head and the final norm


def test_the_synced_top_layer_adds_one_weight_gradient_in_place() -> None:
    """Full bf16, CPU offload, two micro-batches of 2 x 512 on 4 GPUs (simulate: at the top layer's
    backward the accumulated gradients less the tail's, beside one new 14336 x 4096 gradient)."""
    spec = reduced_model("mistral-community/Mistral-7B-v0.2", 4)
    run = resolve_run(spec, build_setup(spec, method="full", precision="bf16", framework="hf", batch=2,
                                        seq=512, grad_accum=2, gradient_checkpointing=True,
                                        optimizer="adamw-hf", gpus=4, fsdp=True, fsdp_version=2,
                                        offload="all"))
    rows = memory_at(run, 2, 512).rows
    assert MISTRAL_LAYER == 218_112_000
    accumulated = (4 * MISTRAL_LAYER + MISTRAL_EMBED + MISTRAL_HEAD) * 2
    assert accumulated == 2_269_192_192  # simulate: the unsharded gradients through the next forward
    new_weight = 14336 * 4096 * 2
    # the synced micro-batch: the tail reduce-scattered (its shard on the host) before the top layer
    assert named(rows["backward_layers_top"]).gradients == accumulated - MISTRAL_HEAD * 2 + new_weight
    # the second layer: the first micro-batch's gradients (the tail's and three layers') outweigh the
    # synced one's (the embedding's and two layers' accumulated, one new weight gradient)
    first = (MISTRAL_HEAD + 3 * MISTRAL_LAYER) * 2
    assert first > (MISTRAL_EMBED + 2 * MISTRAL_LAYER) * 2 + new_weight
    assert named(rows["backward_layers_bottom"]).gradients == first
    # the next micro-batch's forward still holds every accumulated gradient
    assert named(rows["forward_layers_top"]).gradients == accumulated


def test_more_micro_batches_hold_every_accumulated_gradient() -> None:
    """Four micro-batches: the second and third follow an accumulating one and do not sync."""
    spec = reduced_model("mistral-community/Mistral-7B-v0.2", 4)
    run = resolve_run(spec, build_setup(spec, method="full", precision="bf16", framework="hf", batch=2,
                                        seq=512, grad_accum=4, gradient_checkpointing=True,
                                        optimizer="adamw-hf", gpus=4, fsdp=True, fsdp_version=2,
                                        offload="all"))
    rows = memory_at(run, 2, 512).rows
    accumulated = (4 * MISTRAL_LAYER + MISTRAL_EMBED + MISTRAL_HEAD) * 2
    assert named(rows["backward_layers_bottom"]).gradients == accumulated + 14336 * 4096 * 2


def test_the_second_of_two_layers_holds_no_layer_reduce_scatter_input() -> None:
    """fp32 freeze of both layers, 8 GPUs: the frozen untied tail reduces nothing before the top layer
    (simulate: 2,269,184,000 B of parallel buffers at the run's peak, two layers unsharded and the
    prefetched embedding group, no third layer's)."""
    spec = reduced_model("mistral-community/Mistral-7B-v0.2", 2)
    run = resolve_run(spec, build_setup(spec, method="freeze", precision="fp32", framework="llamafactory",
                                        batch=1, seq=64, gradient_checkpointing=False, attn="sdpa", gpus=8,
                                        fsdp=True, fsdp_version=2))
    rows = memory_at(run, 1, 64).rows
    assert named(rows["backward_layers_bottom"]).parallel_buffers == 2 * MISTRAL_LAYER * 4 == 1_744_896_000


def test_the_untied_tail_reduce_scatters_before_the_top_layer() -> None:
    """Full fp32 with CPU offload, 3 layers on 2 GPUs (simulate: 4,024,492,032 B of parallel buffers at the
    run's peak, the tail's reduce-scatter output allocated): ``foreach_reduce``'s flat input and output
    beside the head's unsharded gradient, the top layer's prefetched flat buffer, every layer's
    activations."""
    spec = reduced_model("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", 3)
    run = resolve_run(spec, build_setup(spec, method="full", precision="fp32", framework="hf", batch=1,
                                        seq=128, optimizer="adamw-fused", gpus=2, fsdp=True, fsdp_version=2,
                                        offload="all"))
    rows = memory_at(run, 1, 128).rows
    # Llama-3-8B: vocab 128256 x hidden 4096 (untied head), a layer as Mistral-7B's
    tail = (128256 * 4096 + 4096) * 4
    row = named(rows["backward_tail_reduce"])
    assert row.parallel_buffers == tail + tail // 2 + MISTRAL_LAYER * 4 == 4_024_492_032
    assert row.backward_temp == tail
    assert row.gradients == 0  # no shard made on the device (CPU offload)


def test_a_tied_head_gradient_waits_for_the_embedding_beside_the_accumulated_ones() -> None:
    """Full fp32 Falcon-7B (tied head), CPU offload, two micro-batches of 4 x 64 on 4 GPUs (simulate: at the
    layers' backward the 65024 x 4544 fp32 head gradient waits in autograd's input buffer for the
    embedding's contribution, beside the accumulated tied gradient and the layers')."""
    spec = reduced_model("tiiuae/falcon-7b", 3)
    run = resolve_run(spec, build_setup(spec, method="full", precision="fp32", framework="hf", batch=4,
                                        seq=64, grad_accum=2, optimizer="adamw", attn="sdpa", gpus=4,
                                        fsdp=True, fsdp_version=2, offload="all"))
    rows = memory_at(run, 4, 64).rows
    # Falcon-7B: hidden 4544, fused query_key_value 4544 x (71 + 2) x 64, dense 4544 x 4544, MLP 4544 x
    # 18176 twice, one LayerNorm (weight and bias) per layer; the tied embedding 65024 x 4544, ln_f 2 x 4544
    layer = 4544 * 4672 + 4544 * 4544 + 2 * 4544 * 18176 + 2 * 4544
    assert layer == 207_070_080
    embed = 65024 * 4544
    accumulated = (3 * layer + embed + 2 * 4544) * 4
    new_weight = 18176 * 4544 * 4
    pending_head = embed * 4
    assert named(rows["backward_layers_top"]).gradients == accumulated + new_weight + pending_head \
        == 5_178_996_736
