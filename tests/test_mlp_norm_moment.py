"""ZeRO-1's lowest trained layer at its MLP's input RMSNorm backward: the MLP block's weight gradients made,
the attention's not, the attention block's saved tensors whole beside the norm's fp32 input and its five
h-wide fp32 gradients (estimator/mlp_norm_moment.py; LlamaRMSNorm.forward, torch pow_backward)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.instants import memory_at, named  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402

H, FFN, TOKENS = 4096, 11008, 4 * 512


def _rows(model: str = "meta-llama/Llama-2-7b-hf", **kw):
    spec = reduced_model(model, 2)
    setup = build_setup(spec, **{**dict(method="freeze", precision="bf16", framework="hf", batch=4, seq=512,
                                        gradient_checkpointing=True, optimizer="paged-adamw", gpus=4, zero=1,
                                        offload="optimizer"), **kw})
    return memory_at(resolve_run(spec, setup), 4, 512).rows


def test_zero1_bottom_layer_at_its_mlp_norm_backward() -> None:
    # Llama-2-7b, both of two layers trained, bf16, 4 x 512 = 2,048 tokens, checkpointed. The layer's
    # gradients: 4 x 4096^2 + 3 x 4096 x 11008 elements (+ two norms) x 2 B = 404,766,720 B counted in
    # the bottom row; the MLP block's made at this moment: 3 x 4096 x 11008 x 2 = 270,532,608 B.
    # Recomputed per token: the attention block's saves (input norm fp32 16,384 + rstd 4 + its bf16 cast
    # 8,192 + q/k/v projections' input 8,192 + SDPA's q, k, v, out 4 x 8,192 = 32,768 + o_proj's input
    # counted once with the core: 65,668 B less what repeats) and the MLP norm's fp32 input and rstd:
    # 65,668 + 16,388 = 82,056 B/token -> 168,050,688 B; scratch: (5 x 4 + 2) x 4096 = 90,112 B/token
    # -> 184,549,376 B (simulate: 185,104,384 B of activations with the 16,777,216 B embedding output, and
    # 16,777,216 + 5 x 33,554,432 = 184,549,376 B of scratch at layer 0's post_attention_layernorm)
    rows = _rows()
    mid = named(rows["backward_layer_mlp_norm"])
    bottom = named(rows["backward_layers_bottom"])
    layer = (4 * H * H + 3 * H * FFN + 2 * H) * 2
    assert layer == 404_766_720
    assert mid.gradients == bottom.gradients - layer + 3 * H * FFN * 2
    assert mid.activations == TOKENS * 82_056 == 168_050_688
    assert mid.backward_temp == TOKENS * 22 * H == 184_549_376
    # the larger moment: the attention block keeps more than its 134 MB of weight gradients weigh
    assert sum(mid) > sum(bottom)


def test_not_modelled_for_layernorm_models() -> None:
    # GPT-NeoX's LayerNorm backward is one native_layer_norm_backward kernel: no such moment
    assert "backward_layer_mlp_norm" not in _rows("EleutherAI/pythia-6.9b")
