"""Layers whose framework replaces PyTorch's module-by-module autograd with fused kernels.

Each function returns the layer's ``LayerActs`` when the framework's fused path applies, or None when the
framework itself falls back to the unfused modules (then ``activations.layer_activations`` counts them).
"""

from __future__ import annotations

from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.saved_tensors import LSE_BYTES, RSTD_BYTES, LayerActs
from tuneplan.specs.model import LayerSpec, ModelSpec
from tuneplan.specs.setup import TrainSetup


def unsloth_fast_lora_layer(model: ModelSpec, spec: LayerSpec, setup: TrainSetup, dtypes: Dtypes,
                            targets: frozenset[str]) -> LayerActs | None:
    """A Llama-style layer under Unsloth's fused LoRA kernels (unsloth/kernels/fast_lora.py), or None where
    Unsloth falls back to PEFT (adapters on only some projections, LoRA dropout, other architectures).

    ``LoRA_QKV`` saves its input X; RoPE rotates q and k in place; flash-attention keeps q, k, v (K/V
    grouped), its output and the log-sum-exp; ``LoRA_W`` keeps its input, which is that output; each
    ``fast_rms_layernorm`` keeps its 16-bit input and rstd; ``LoRA_MLP`` keeps X, e = X @ G and g = X @ U
    and recomputes the SwiGLU in backward, where ``_backward_function`` overwrites e and g in place and dX
    is written into X: one intermediate-wide gradient (DW) is the only new activation-sized buffer."""
    if not setup.is_lora or (setup.dropout or 0) > 0 or model.is_moe:
        return None
    if model.mlp_kind != "swiglu" or model.norm_kind != "rms":
        return None
    if not all(m.name in targets for m in spec.linears):
        return None
    compute_bytes, hidden = dtypes.compute, model.hidden
    heads, head_dim, kv_width = model.n_heads, model.head_dim, model.n_kv_heads * model.head_dim
    inter = spec.mlp_intermediate or model.intermediate
    saved = (compute_bytes * (hidden + hidden) + compute_bytes * (2 * heads * head_dim + 2 * kv_width)
             + compute_bytes * (hidden + hidden) + compute_bytes * 2 * inter)
    saved += LSE_BYTES * heads + 2 * RSTD_BYTES
    return LayerActs(per_token=saved, per_token_per_pos=0.0,
                     backward_temp=compute_bytes * inter + dtypes.residual * 2 * hidden,
                     backward_temp_per_pos=0.0)
