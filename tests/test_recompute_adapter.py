"""The recomputed layer's last LoRA adapter in its forward, inside the backward: PEFT's ``Linear.forward``
casts the down projection's input to the fp32 adapter's dtype and drops it out, beside the base layer's
output and the incoming gradient of the layer's output (estimator/recompute_adapter.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.activations import layer_activations  # noqa: E402
from tuneplan.estimator.dtypes import resolve_dtypes  # noqa: E402
from tuneplan.specs.lora_targets import resolve_targets  # noqa: E402
from tuneplan.specs.profiles import get_profile, resolve_setup  # noqa: E402


def _acts(checkpointing: bool):
    spec = reduced_model("mistralai/Mistral-7B-v0.1", 2)
    s = resolve_setup(build_setup(spec, method="lora", precision="bf16-mixed", framework="fsdp-qlora",
                                  batch=4, seq=384, rank=64, dropout=0.05, attn="eager",
                                  gradient_checkpointing=checkpointing), spec)
    dt = resolve_dtypes(s, get_profile("fsdp-qlora"))
    assert dt.autocast and dt.adapter == 4 and dt.residual == 4 and dt.linear_out == 2
    return layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "eager", False)


def test_recomputed_down_adapter_transients_are_the_layer_scratch() -> None:
    # Mistral-7B (h 4096, MLP 14336), LoRA r64 on fsdp_qlora's q, k, v, gate, up, down, fp32 adapters under
    # bf16 autocast, dropout 0.05, checkpointed. At down_proj's lora_A in the recomputation, per token:
    # the bf16 product nothing saves (the frozen base keeps no input) 2 x 14336, PEFT's fp32 cast of it
    # 4 x 14336, the dropout's fp32 output 4 x 14336, the base layer's bf16 output 2 x 4096, and the
    # incoming fp32 gradient of the layer's output 4 x 4096
    expected = 2 * 14336 + 4 * 14336 + 4 * 14336 + 2 * 4096 + 4 * 4096
    assert _acts(True).backward_temp == expected == 167_936


def test_without_checkpointing_the_forward_is_not_inside_the_backward() -> None:
    assert _acts(False).backward_temp < 167_936


def test_fsdp2_recomputed_down_adapter_transients() -> None:
    # falcon-40b (h 8192, MLP 32768, parallel attention + MLP), LoRA r8 all-linear, dropout 0.05, FSDP2 on 4
    # GPUs, LLaMA-Factory fp16 (autocast, fp32 adapters, checkpointed by its default), batch 3 x 2048.
    # fully_shard all-gathers the top layer and checkpoint replays its forward: at dense_4h_to_h's lora_A,
    # per token: the fp16 GELU output nothing saves 2 x 32768, PEFT's fp32 cast 4 x 32768, the fp32
    # dropout output 4 x 32768, the base layer's fp16 output 2 x 8192, and the two fp16 gradients of the
    # layer's output (the residual's and the parallel block's sum) 2 x 2 x 8192, and what the parallel
    # block's forward still references (test below) 81,920
    # (simulate: 805,306,368-byte fp32 cast and dropout output, 402,653,184-byte GELU output at 6144 tokens)
    spec = reduced_model("tiiuae/falcon-40b", 3)
    s = resolve_setup(build_setup(spec, method="lora", precision="fp16", framework="llamafactory", batch=3,
                                  seq=2048, grad_accum=2, rank=8, targets="all-linear", dropout=0.05,
                                  optimizer="adamw-8bit", attn="flash", gpus=4, fsdp=True, fsdp_version=2),
                      spec)
    assert s.gradient_checkpointing
    dt = resolve_dtypes(s, get_profile("llamafactory"))
    assert dt.autocast and dt.adapter == 4 and dt.linear_out == 2
    acts = layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "flash", False)
    expected = 2 * 32768 + 4 * 32768 + 4 * 32768 + 2 * 8192 + 2 * 2 * 8192 + 81_920
    assert acts.backward_temp == expected == 458_752


def test_falcon_parallel_block_holds_its_attention_output_and_norm_outputs() -> None:
    # FalconDecoderLayer.forward (new_decoder_architecture, two LayerNorms) keeps attention_layernorm_out,
    # mlp_layernorm_out and attention_output in locals until ``mlp_output += attention_output``. Under
    # autocast both LayerNorm outputs are fp32 (4 x 8192 each), saved by nothing (frozen projections, PEFT
    # casts its own copy); the attention's output is fp16 (2 x 8192): 4 x 8192 + 4 x 8192 + 2 x 8192
    # (simulate: r19 above, two 201,326,592-byte fp32 native_layer_norm outputs and the 100,663,296-byte
    # dense output live at the peak, 6144 tokens)
    from tuneplan.estimator.attention_saved import attention_block
    from tuneplan.estimator.layer_saved import mlp_block
    from tuneplan.estimator.layer_walk import LayerWalk
    from tuneplan.estimator.recompute_adapter import parallel_block_locals

    spec = reduced_model("tiiuae/falcon-40b", 3)
    s = resolve_setup(build_setup(spec, method="lora", precision="fp16", framework="llamafactory", batch=3,
                                  seq=2048, rank=8, targets="all-linear", dropout=0.05, attn="flash", gpus=4,
                                  fsdp=True, fsdp_version=2), spec)
    dt = resolve_dtypes(s, get_profile("llamafactory"))
    walk = LayerWalk(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False, False,
                     False, True, False, False)
    attention_block(walk, "flash")
    mlp_block(walk)
    assert parallel_block_locals(walk) == 4 * 8192 + 4 * 8192 + 2 * 8192 == 81_920
