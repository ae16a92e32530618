"""bitsandbytes' ``Linear4bit.forward`` casts its output back to its input's dtype (``out.to(inp_dtype)``).
Under CUDA autocast a LayerNorm returns fp32 (``layer_norm`` is on autocast's fp32 list), so a 4-bit linear
reading it returns fp32, and so does the sum with its adapter: the tensors after it are fp32 too
(estimator/layer_walk.LayerWalk.out_bytes, layer_saved.feed_forward, attention_saved). With it, from the
same traces: a parallel block's MLP norm in the bottom layer keeps nothing (its input needs no gradient),
two norms reading one layer input keep one storage, and LoRA's dropout on an input that needs no gradient
keeps no mask (layer_walk.LayerWalk.linear)."""

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


def _layer(model: str, framework: str, input_requires_grad: bool, **kw) -> float:
    spec = reduced_model(model, 2)
    s = resolve_setup(build_setup(spec, method="qlora", precision="bf16-mixed", framework=framework, batch=1,
                                  seq=256, targets="all-linear", gradient_checkpointing=False, **kw), spec)
    dt = resolve_dtypes(s, get_profile(framework))
    assert dt.autocast and dt.compute == 2
    acts = layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             s.attn, True, input_requires_grad=input_requires_grad)
    return acts.per_token


# Pythia-6.9B (GPT-NeoX: h 4096, 32 heads of 128, MLP 16384, two LayerNorms on the layer input, fused
# query_key_value), QLoRA r8 on its four linears, dropout 0.05, flash attention; per token (bytes):
#   the layer input, fp32 (the layer below's MLP returned fp32), read by both norms: 4 x 4096 once, with
#   each norm's mean and rstd 2 x 2 x 4
#   query_key_value: lora_A's 16-bit cast of the fp32 norm output 2 x 4096, its output 2 x 8, dropout mask
#   4096; its fp32 output is cast to bf16 for the kernel q, k, v: 3 x 2 x 4096 (no view of the fused
#   buffer survives); the kernel's output 2 x 4096, log-sum-exp 4 x 32
#   dense: reads the 16-bit output: dropout's copy 2 x 4096, mask 4096, lora_A output 2 x 8
#   dense_h_to_4h: lora_A's cast 2 x 4096, output 2 x 8, mask 4096; its fp32 output, saved by GELU,
#   4 x 16384
#   dense_4h_to_h: lora_A's cast of the fp32 GELU output 2 x 16384, output 2 x 8, mask 16384
PYTHIA_UPPER = (4 * 4096 + 2 * 2 * 4
                + 2 * 4096 + 2 * 8 + 4096 + 3 * 2 * 4096 + 2 * 4096 + 4 * 32
                + 2 * 4096 + 4096 + 2 * 8
                + 2 * 4096 + 2 * 8 + 4096 + 4 * 16384
                + 2 * 16384 + 2 * 8 + 16384)
# the bottom layer (its input, bf16 embeddings, needs no gradient): neither norm keeps anything, and the
# dropouts on the normalized input (query_key_value's, dense_h_to_4h's) keep no mask
PYTHIA_BOTTOM = PYTHIA_UPPER - (4 * 4096 + 2 * 2 * 4) - 2 * 4096


def test_pythia_qlora_upper_layer() -> None:
    # simulate: Pythia-6.9B QLoRA at 2 layers, 4 x 2048: the same blocks, layer by layer
    assert PYTHIA_UPPER == 200_912
    assert _layer("EleutherAI/pythia-6.9b", "hf", True, rank=8, dropout=0.05, attn="flash") == PYTHIA_UPPER


def test_pythia_qlora_bottom_layer() -> None:
    assert PYTHIA_BOTTOM == 176_320
    assert _layer("EleutherAI/pythia-6.9b", "hf", False, rank=8, dropout=0.05, attn="flash") == PYTHIA_BOTTOM


def test_phi_qlora_gelu_new_in_fp32() -> None:
    # phi-1_5 (h 2048, 32 heads of 64, MLP 8192, one LayerNorm shared by the attention and the MLP, separate
    # q/k/v), QLoRA r128, no dropout, SDPA, an upper layer; per token (bytes):
    #   the norm: its fp32 input 4 x 2048 (the layer below returned fp32) and mean / rstd 2 x 4
    #   q, k, v and fc1 read the fp32 norm output: each lora_A's 16-bit cast 4 x 2 x 2048, outputs
    #   4 x 2 x 128; the kernel's q, k, v (autocast's casts of the fp32 outputs) 3 x 2 x 2048, its output
    #   2 x 2048 (dense's and its adapter's input), log-sum-exp 4 x 32, dense's lora_A output 2 x 128
    #   gelu_new, 0.5 * x * (1 + tanh(k * (x + 0.044715 * x^3))) on fc1's fp32 output: pow keeps x, tanh
    #   its output, the product 0.5 * x and 1 + tanh: 4 x 4 x 8192 (0.5 * x is fp32 like x)
    #   fc2: lora_A's 16-bit cast of the fp32 GELU output 2 x 8192, its output 2 x 128
    expected = (4 * 2048 + 2 * 4
                + 4 * 2 * 2048 + 4 * 2 * 128 + 3 * 2 * 2048 + 2 * 2048 + 4 * 32 + 2 * 128
                + 4 * 4 * 8192
                + 2 * 8192 + 2 * 128)
    assert expected == 190_088
    # (simulate: phi-1_5 QLoRA at 4 layers, 1 x 2048, layers 1-3: the same blocks)
    got = _layer("microsoft/phi-1_5", "llamafactory", True, rank=128, dropout=0.0, attn="sdpa")
    assert got == expected


def _falcon(input_requires_grad: bool) -> float:
    spec = reduced_model("tiiuae/falcon-40b", 2)
    s = resolve_setup(build_setup(spec, method="lora", precision="bf16", framework="fsdp-qlora", batch=1,
                                  seq=256, rank=16, targets="attn", dropout=0.0, attn="flash",
                                  gradient_checkpointing=False), spec)
    dt = resolve_dtypes(s, get_profile("fsdp-qlora"))  # bf16 weights and adapters, no autocast
    assert not dt.autocast and dt.compute == 2
    acts = layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "flash", True, input_requires_grad=input_requires_grad)
    return acts.per_token


def test_falcon_40b_parallel_block() -> None:
    # Falcon-40B (new_decoder_architecture: ln_attn and ln_mlp both read the layer input, the MLP runs beside
    # the attention; h 8192, 128 query heads and 8 KV heads of 64, MLP 32768), LoRA r16 on query_key_value
    # and dense, pure bf16 (the fsdp_qlora profile), flash attention; per token (bytes), an upper layer:
    #   the layer input, saved by both native_layer_norm nodes: 2 x 8192 once, mean / rstd 2 x 2 x 4
    #   query_key_value's lora_A: the norm output 2 x 8192, its output 2 x 16; the kernel's q 2 x 8192, k
    #   and v 2 x 2 x 512, output 2 x 8192 (dense's adapter input), log-sum-exp 4 x 128; dense's lora_A
    #   output 2 x 16
    #   the frozen MLP: GELU keeps its input, dense_h_to_4h's output, 2 x 32768 (the frozen linears keep
    #   nothing: no weight gradient)
    upper = (2 * 8192 + 2 * 2 * 4 + 2 * 8192 + 2 * 16 + 2 * 8192 + 2 * 2 * 512 + 2 * 8192 + 4 * 128 + 2 * 16
             + 2 * 32768)
    assert upper == 133_712
    assert _falcon(True) == upper
    # the bottom layer: its input needs no gradient, so the norms keep nothing and the MLP, which reads it
    # and has no adapter, is outside the graph (simulate: Falcon-40B LoRA at 2 layers, layer 0's MLP keeps
    # no tensor)
    bottom = upper - (2 * 8192 + 2 * 2 * 4) - 2 * 32768
    assert bottom == 51_776
    assert _falcon(False) == bottom
