"""What one layer keeps for backward, as a record, and the small counts several ledgers share.

``LayerActs`` is what ``activations.layer_activations`` (transformers-style modules) and
``fused_layers`` (framework kernels that replace whole sub-blocks) both return; the byte constants and the
embedding-gradient formulas live here once so that the simulate engine's kernel stand-ins can use them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.xp import maximum
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

LSE_BYTES = 4  # flash / memory-efficient kernels keep an fp32 log-sum-exp per head per token
RSTD_BYTES = 4  # RMSNorm keeps rsqrt(mean(x^2) + eps): one fp32 per token
DROPOUT_MASK_BYTES = 1  # CUDA fused dropout (native_dropout) keeps a bool mask, one byte per element


# hashable, not frozen (read-only by convention): made for every new setup, and a frozen dataclass's
# __init__ sets each field through object.__setattr__
@dataclass(unsafe_hash=True)
class LayerActs:
    per_token: float  # bytes per token kept by one layer (O(s) part)
    per_token_per_pos: float  # eager attention: bytes per token per key position (x s)
    backward_temp: float  # bytes per token of activation gradients while back-propagating this layer
    backward_temp_per_pos: float
    # inputs bitsandbytes' MatMul4Bit (<= 0.43) keeps in ``ctx.tensors``, a Python attribute that backward
    # does not release: they live until the graph itself is dropped (part of ``per_token``)
    pinned: float = 0.0
    # per token, while the attention is back-propagated: the residual gradients minus what the MLP block
    # (and its norm) kept, released by then (backward_temp_per_pos applies from that point on)
    attn_backward_offset: float = 0.0
    # per token, what the layer keeps that is its own input (the first norm's saved input, uncast): the
    # checkpoint under gradient checkpointing, so a recomputed layer does not add it again
    input_alias: float = 0.0
    # bytes per layer, whatever the tokens: kept for backward (a LoRA'd fused expert stack's effective
    # weight, estimator/fused_expert_lora.py) and, while the layer is back-propagated, a stack's weight
    # gradient
    per_layer: float = 0.0
    backward_per_layer: float = 0.0
    # per token, the activation gradients live beside ``backward_per_layer`` (instead of ``backward_temp``)
    backward_per_layer_per_token: float = 0.0
    # per token, what the MLP block (and its norm) keeps: released once the block is back-propagated
    mlp_saved: float = 0.0
    # per token, when the layer's first LoRA adapter (forward order) starts its backward: what the layer
    # still keeps (0: no adapter in the layer; -1: not derived, the attention's O(s) part saved before it)
    # and the activation gradients live then (layer_saved.first_target_terms)
    first_target_saved: float = 0.0
    first_target_temp: float = 0.0
    # ... and per token per key position, an eager attention's O(s) saved part kept then (0: none)
    first_target_per_pos: float = 0.0
    # alike when the layer's first trained gradient is ready: its last LoRA adapter's in forward order
    # (layer_saved.last_target_terms; 0: no adapter or the MLP's, -1: not derived)
    last_target_saved: float = 0.0
    last_target_temp: float = 0.0
    # per token, beside the recomputed 4-bit down projection's dequantized weight, relative to per_token
    # (recompute_dequant.py; 0: none)
    recompute_dequant: float = 0.0


def embedding_backward_scratch(tokens: int, hidden: int) -> int:
    """CUDA ``embedding_dense_backward`` (aten/src/ATen/native/cuda/EmbeddingBackwardKernel.cu) sorts the
    indices (two int64 copies), keeps int64 segment offsets per index and accumulates partial segments in
    fp32 ``[segments, hidden]`` (at most one segment per token) before writing the dense gradient."""
    return 3 * 8 * tokens + 4 * tokens * hidden


def embedding_backward(model: ModelSpec, setup: TrainSetup, dtypes: Dtypes) -> tuple[int, int]:
    """``embedding_backward_at`` for the setup's own batch x seq tokens."""
    return embedding_backward_at(model, setup.method, dtypes, setup.batch * setup.seq)


def embedding_backward_at(model: ModelSpec, method: str, dtypes: Dtypes, tokens: Any) -> tuple[Any, Any]:
    """(embedding gradient bytes, transient bytes beyond all gradients at the embedding backward).

    Tied embeddings: autograd's InputBuffer holds the lm_head's contribution to the shared weight until
    the embedding's arrives, then sums them out of place (``old_var + var``): the two contributions and
    their sum are live together, two gradients' worth beyond the final one (simulate: Qwen2.5-0.5B and
    gemma-2b full fine-tunes peak at that ``add``). Untied: the dense gradient becomes ``.grad``; only the
    kernel's scratch and its incoming gradient are extra (Qwen2.5-7B full + checkpointing peaks there).
    ``tokens`` may be a numpy array (a grid): see ``estimator/xp.py``."""
    if method != "full":
        return 0, 0
    grad = model.vocab * model.hidden * dtypes.trainable
    # the kernel's scratch, plus the incoming gradient of the embedding output (param dtype)
    during = embedding_backward_scratch(tokens, model.hidden) + tokens * model.hidden * dtypes.trainable
    if model.tied_embeddings:
        return grad, maximum(2 * grad, grad + during)
    return grad, during
