"""Unsloth's fused LoRA kernels, counted by hand from unsloth/kernels/fast_lora.py and fast_rms_layernorm."""

from __future__ import annotations

from tuneplan.api import estimate
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.activations import layer_activations
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.profiles import get_profile

LLAMA31_8B = "meta-llama/Llama-3.1-8B-Instruct"


def _layer(targets: str, dropout: float = 0.0) -> float:
    spec = resolve_model(LLAMA31_8B, allow_network=False)
    s = estimate(spec, framework="unsloth", method="qlora", targets=targets, dropout=dropout,
                 timing=False).setup
    dt = resolve_dtypes(s, get_profile("unsloth"))
    return layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "flash", False, unsloth_code=True).per_token


def test_fused_lora_layer_by_hand() -> None:
    # Llama-3.1-8B (h 4096, 32 heads of 128, 8 KV heads, intermediate 14336), bf16, per token:
    # two norms keep their input (2h) and rstd (4 B); LoRA_QKV keeps its input (2h); flash-attention keeps
    # q (2h), k and v (2 x 2 x 1024), its output (2h, also LoRA_W's input) and the fp32 log-sum-exp (4 x 32);
    # LoRA_MLP keeps X (2h), e and g (2 x 2 x 14336)
    h, kv, inter = 4096, 1024, 14336
    expected = 2 * h * 2 + 2 * h + (2 * h + 2 * 2 * kv + 2 * h) + 4 * 32 + 2 * h + 2 * 2 * inter + 2 * 4
    assert _layer("all-linear") == expected


def test_fallbacks_keep_more() -> None:
    # adapters on only some projections, or LoRA dropout: Unsloth falls back to PEFT's layers, which keep
    # the SwiGLU's three intermediate-wide tensors and the dropout masks
    assert _layer("q_proj,v_proj") > _layer("all-linear")
    assert _layer("all-linear", dropout=0.05) > _layer("all-linear")
