"""FSDP2's lower trained layer at its attention core's backward (wrappers/fully_shard_attention.py): the MLP's
and o_proj's unsharded weight gradients made, the MLP block's saved tensors released, expected figures
derived by hand from Llama-2-70b's shapes and the modeling code's saved tensors."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.instants import memory_at, named, saved_at  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402

H, W, KV = 8192, 28672, 1024  # Llama-2-70b: hidden, MLP width, k/v width (GQA)
LAYER = 2 * H * H + 2 * KV * H + 3 * W * H + 2 * H
MADE = 3 * W * H + H * H  # gate, up, down and o_proj: back-propagated before the attention core


def _run(layers: int, **kw: object):
    spec = reduced_model("meta-llama/Llama-2-70b-hf", layers)
    setup = dict(precision="fp32", framework="hf", grad_accum=1, optimizer="adamw-hf", gpus=2, fsdp=True,
                 fsdp_version=2, offload="all")
    return resolve_run(spec, build_setup(spec, **{**setup, **kw}))


def _mlp_saved(tokens: int) -> int:
    # LlamaRMSNorm (post_attention_layernorm): pow's input, rsqrt's output (one per token), the normalised
    # hidden before the weight; its output (gate's and up's input); SiLU's input (gate's output), mul's two
    # inputs (SiLU's and up's outputs), down's input: fp32, 4 B each
    return (3 * tokens * H + tokens + 4 * tokens * W) * 4


def _scores_scratch(tokens: int, seq: int) -> int:
    # at the softmax's backward: the fp32 probabilities' and scores' gradients (4 + 4 B per head per key
    # position, 64 heads) and the residual gradient with its accumulated copy (2 x h x 4 B per token), the
    # MLP block's saved tensors and o_proj's input with the attention output (2 x h x 4 B per token)
    # released by then
    return tokens * seq * 64 * 8 + tokens * 2 * H * 4 - _mlp_saved(tokens) - tokens * 2 * H * 4


def test_freeze_lowest_trained_layer_at_its_attention_core() -> None:
    # 4 layers, the top 2 trained (freeze), eager scores under fp32 (SDPA's math path), 2 x 2048 tokens,
    # CPU offload (the shards on the host): at layer 2's attention backward its MLP and o_proj fp32
    # gradients exist (no flat reduce-scatter input before its post_backward), the layers below frozen
    # (nothing saved), two layers unsharded and layer 3's reduce-scatter input (fp32) beside them
    run = _run(4, method="freeze", batch=2, seq=2048)
    assert run.setup.freeze_trainable_layers == 2
    rows = memory_at(run, 2, 2048).rows
    acts = saved_at(memory_statics(run).acts, 2, 2048)
    row = named(rows["backward_layer_attention"])
    assert row.gradients == MADE * 4
    assert row.activations == acts.top_layer_bytes
    assert row.backward_temp == _scores_scratch(4096, 2048)
    assert row.parallel_buffers == 3 * LAYER * 4
    # the row itself folded: its end, every fp32 gradient made, as many bytes of its activations released
    bottom = named(rows["backward_layers_bottom"])
    assert bottom.gradients == LAYER * 4
    assert bottom.activations == acts.top_layer_bytes - LAYER * 4
    # the top layer's own moment: both trained layers' activations, its MLP and o_proj gradients, the top
    # layer and the one below unsharded (no reduce-scatter input before it: the head is frozen)
    top = named(rows["backward_top_attention"])
    assert top.gradients == MADE * 4
    assert top.activations == acts.saved_bytes - acts.tail_bytes
    assert top.backward_temp == _scores_scratch(4096, 2048)
    assert top.parallel_buffers == 2 * LAYER * 4


def test_full_second_layer_beside_the_lower_layers_activations() -> None:
    # full, 3 layers: the row's layer (1) has layer 0's activations saved beside it, one layer's more
    run = _run(3, method="full", batch=1, seq=1024)
    rows = memory_at(run, 1, 1024).rows
    layer_acts = saved_at(memory_statics(run).acts, 1, 1024).top_layer_bytes
    row = named(rows["backward_layer_attention"])
    assert row.activations == 2 * layer_acts
    assert named(rows["backward_layers_bottom"]).activations == layer_acts  # left unfolded


def test_no_moment_without_materialised_scores() -> None:
    # bf16-mixed with SDPA's fused kernels: no scores' gradients, no attention-core row; the lowest trained
    # layer's row is still folded (its weight gradients made as MmBackward0 frees their saved inputs): at
    # 3 x 1024 tokens its end, the layer's 855.6 M bf16 gradients (1.71 GB), outweighs its 1.22 GB of
    # activations, all released by then
    run = _run(4, method="freeze", batch=3, seq=1024, precision="bf16-mixed", offload="none")
    rows = memory_at(run, 3, 1024).rows
    assert "backward_layer_attention" not in rows and "backward_top_attention" not in rows
    assert saved_at(memory_statics(run).acts, 3, 1024).top_layer_bytes < LAYER * 2
    assert named(rows["backward_layers_bottom"]).activations == 0


def test_checkpointed_freeze_with_frozen_layers_back_propagated() -> None:
    # the HF Trainer's checkpointing makes the embedding's output require grad, so the frozen layers 0 and
    # 1 are back-propagated after the lowest trained one (layer 2) for their input's gradient. Layer 2's
    # row, flash attention, bf16-mixed, 1 x 1024 tokens, CPU offload: its recomputation (0.41 GB) goes as
    # its bf16 gradients (LAYER x 2 B = 1.71 GB) are made, so the row is its end: those gradients, no
    # recomputed activation left, its scratch, layer 2 and the frozen layer 1 it prefetched unsharded and
    # layer 3's reduce-scatter input (3 x LAYER x 2 B)
    run = _run(4, method="freeze", batch=1, seq=1024, precision="bf16-mixed", gradient_checkpointing=True,
               attn="flash")
    assert run.setup.freeze_trainable_layers == 2
    acts = saved_at(memory_statics(run).acts, 1, 1024)
    assert 0 < acts.recompute_bytes < LAYER * 2
    row = named(memory_at(run, 1, 1024).rows["backward_layers_bottom"])
    assert row.gradients == LAYER * 2
    assert row.activations == 0
    assert row.parallel_buffers == 3 * LAYER * 2
