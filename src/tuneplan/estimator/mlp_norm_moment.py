"""A layer whose weight gradients are made as its backward goes (wrappers/base.TopLayer: ZeRO-1's lowest
trained layer), at its MLP's input RMSNorm backward: the MLP block's weight gradients made, the
attention's not, the MLP block's saved tensors released, the norm's fp32 scratch live.

transformers' RMSNorm (``LlamaRMSNorm.forward``: ``x32 = x.to(float32)``, ``var = x32.pow(2).mean(-1)``,
``x32 * rsqrt(var + eps)``, ``weight * ...to(input_dtype)``) is back-propagated op by op; at pow's backward
(torch FunctionsManual.cpp ``pow_backward``: ``grad * (2 * x32.pow(1))``) five h-wide fp32 tensors are
live: the product's gradient to x32, mean's (``sum_backward`` / numel: a div), the pow, its scaled copy and
their product, beside the residual gradient (layer_saved.input_norm_backward, the same ops at the layer's
input). By then the MLP block has run its backward: its weight gradients ``G_mlp`` are made, its saved
tensors released but the norm's own fp32 input and rstd; the attention block's saved tensors are whole::

    gradients   = G - counted + G_mlp
    activations = A - A_mlp + (4 h + 4) t
    scratch     = (20 h + b_res h) t

with A the layer's activations (recomputed under checkpointing), A_mlp what its MLP block saved
(``ActivationPlan.mlp_saved_bytes``, the norm's tensors included), t the tokens. Against the layer's end
(its attention's gradients made too, its activations gone) this moment is the larger where the attention
block saves more than its weights' gradients weigh (simulate: Llama-2-7b freeze of both of two layers,
ZeRO-1 over 4 GPUs with offload_optimizer, checkpointed, 4 x 512: the peak at layer 0's
post_attention_layernorm ``mul`` in pow's backward, 2,135 MB of step tensors, the MLP's 270 MB of
gradients made). RMSNorm models only, not compiled (inductor fuses the norm), dense MLPs only.
"""

from __future__ import annotations

from typing import Any

from tuneplan.estimator.activations import ActivationPlan
from tuneplan.estimator.saved_tensors import RSTD_BYTES
from tuneplan.estimator.wrappers.base import TopLayer
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

# the fp32 tensors live at the RMSNorm's pow backward, each h wide (module docstring)
NORM_BACKWARD_FP32 = 5


def mlp_block_elements(model: ModelSpec, setup: TrainSetup) -> int:
    """The weight elements of the largest layer's dense MLP block, whose gradients are made before its input
    norm is back-propagated; 0 where the moment is not modelled (MoE layers, a LayerNorm, compiled)."""
    if model.norm_kind != "rms" or setup.compile:
        return 0
    most = 0
    for spec, _ in model.layer_groups:
        if spec.moe:
            return 0
        most = max(most, sum(m.count * m.d_in * m.d_out for m in spec.linears if m.role == "mlp"))
    return most


def mlp_norm_row(row: tuple[Any, ...], layer: TopLayer, acts: ActivationPlan,
                 held: Any) -> tuple[Any, ...] | None:
    """The moment of the module docstring from the layer's unfolded backward row ``row`` (its gradients
    counted whole, its activations A); None where the wrapper gives no ``gradients_at_mlp_norm``."""
    if not layer.gradients_at_mlp_norm:
        return None
    grads, temp, saved, casts, _, _, _ = row
    terms, tokens = acts.terms, acts.tokens
    hidden = terms.model.hidden
    kept = saved - acts.mlp_saved_bytes + tokens * (4 * hidden + RSTD_BYTES)
    scratch = tokens * ((4 * NORM_BACKWARD_FP32 + terms.dtypes.residual) * hidden)
    return (grads - layer.counted + layer.gradients_at_mlp_norm, temp, kept, casts, held, scratch,
            layer.gathered)
