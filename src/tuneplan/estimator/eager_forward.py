"""Eager attention's softmax in a checkpointed layer's forward: the instant ``forward_attention``.

Under gradient checkpointing a layer's forward saves nothing, but its eager attention still builds the
``B x H x S x S`` scores; at the top layer's softmax every checkpoint is live beside them. transformers'
``eager_attention_forward`` (models/llama/modeling_llama.py, copied into falcon, gemma2, ...; BLOOM's
``BloomAttention.forward`` the same with ``alibi.baddbmm``) runs, per score element::

    s = matmul(q, k^T) * scaling          # the compute dtype under autocast, else q's dtype (S bytes)
    s = s + mask                          # promoted with the causal mask, built in the embeddings' dtype (M)
    p = softmax(s, dim=-1, dtype=float32).to(q.dtype)

``torch.softmax`` with ``dtype=float32`` (ATen SoftMax.cpp ``softmax``) runs the half-to-float kernel only
for a CUDA fp16 input; a bf16 input is first copied to fp32 (``_to_copy``) and ``_softmax`` writes a second
fp32 tensor. At ``_softmax`` the masked scores (still bound to ``attn_weights``), that copy and the output
are live: ``max(S, M) + copy + 4`` bytes per score, ``copy = 4`` unless the scores are fp32 or fp16;
BLOOM also keeps ``baddbmm``'s unmasked scores bound (``attention_scores``): ``+ S``.

transformers' Falcon and BLOOM decoder loops (``FalconModel.forward`` / ``BloomModel.forward``) bind each
block's returned ``(output, attn_weights)`` to ``outputs`` until the next block returns, so the previous
layer's probabilities (``q.dtype``, ``Q`` bytes) stay live through the next layer's forward; the other
catalog decoders return the hidden states alone (transformers 5.25). Per token the layer also holds its
attention norm's output, the q/k/v projections (a fused one stays bound, q and k replaced by RoPE's
outputs) and ``repeat_kv``'s copies. With ``t = b s`` tokens, ``H`` heads::

    forward_attention = G0 + checkpoints + t * per_token
                        + t * s * H * (unmasked + max(S, M) + copy + 4 + held)
                        + s^2 * M + autocast copies of the layers + the gathered units

``held = Q`` for Falcon/BLOOM past the bottom layer, else 0. Without checkpointing every layer keeps its
softmax output for backward and the top layer's backward (the scores' gradients, 8 bytes per score) is
larger: the instant is only added for checkpointed runs of transformers' model code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from tuneplan.estimator.activations import ActivationPlan
from tuneplan.estimator.attention_saved import score_dtypes
from tuneplan.estimator.run import Run

if TYPE_CHECKING:  # memory_statics keeps this module's terms (eager_forward_terms)
    from tuneplan.estimator.memory_statics import MemoryStatics

# decoder loops that keep the previous block's returned attention probabilities through the next block
# (FalconModel.forward, BloomModel.forward: ``outputs = block(...)``; transformers 5.25)
HOLDS_PREVIOUS_PROBS = ("falcon", "bloom")
# attention code that keeps the unmasked scores bound through the softmax (BloomAttention.forward)
KEEPS_UNMASKED_SCORES = ("bloom",)


class EagerForward(NamedTuple):
    """Shape-independent terms of the instant: bytes per token, per token and key position (all heads),
    per mask element."""

    per_token: int
    per_pos: int
    mask: int


def eager_forward_terms(run: Run) -> EagerForward | None:
    """The instant's terms (module docstring), or None when it does not apply."""
    model, setup, dtypes = run.model, run.setup, run.dtypes
    # (a device_map card may hold no layer)
    if (run.attn != "eager" or not setup.gradient_checkpointing or run.profile.model_code != "hf"
            or model.architecture != "decoder" or not model.layer_groups):
        return None
    attn_in, proj, q, rope, scores, mask = score_dtypes(model, setup, dtypes)
    masked = max(scores, mask)
    half_to_float = setup.precision.startswith("fp16")
    copy = 0 if (masked == 4 or half_to_float) else 4
    held = q if model.model_type in HOLDS_PREVIOUS_PROBS and model.n_layers > 1 else 0
    # BloomAttention.forward keeps alibi.baddbmm's output bound (``attention_scores``) beside its masked sum
    unmasked = scores if model.model_type in KEEPS_UNMASKED_SCORES else 0
    per_pos = model.n_heads * (unmasked + masked + copy + 4 + held)
    return EagerForward(_layer_per_token(run, attn_in, proj, q, rope), per_pos, mask)


def _layer_per_token(run: Run, attn_in: int, proj: int, q: int, rope: bool) -> int:
    """Bytes per token the top layer holds at its softmax besides the scores: its attention norm's output,
    the projections' outputs (a fused one stays bound: FalconAttention.forward's ``fused_qkv``, q/k/v its
    views, RoPE's q and k new tensors; separate ones: RoPE's q and k replace the projections', v stays)
    and repeat_kv's expanded copies of k and v (a view for one K/V head)."""
    model = run.model
    spec = model.layer_groups[-1][0]
    qkv = [m for m in spec.linears if m.role == "attn" and m.reads == "attn_in"]
    heads, kv, head_dim, v_dim = model.n_heads, model.n_kv_heads, model.head_dim, model.v_head_dim
    if len(qkv) == 1:
        tensors = proj * qkv[0].d_out * qkv[0].count + (q * (heads + kv) * head_dim if rope else 0)
    else:
        tensors = q * (heads + kv) * head_dim + proj * kv * v_dim
    if 1 < kv < heads:
        tensors += q * heads * head_dim + proj * heads * v_dim
    return attn_in * model.hidden + tensors


def forward_attention_row(terms: EagerForward, statics: MemoryStatics, acts: ActivationPlan, batch: Any,
                          seq: Any, prev_pinned: Any, prev_held: Any) -> tuple[Any, ...]:
    """The top layer's softmax in a checkpointed forward (module docstring; ``terms``: the run's
    :func:`eager_forward_terms`, kept in ``statics.eager_forward``), as an instants.InstantRow tuple:
    earlier gradients, every checkpoint and the layer's tensors as activations, the layers' autocast weight
    copies, what the loop holds from the previous micro-batch, the units gathered while a layer runs."""
    tokens = batch * seq
    live = (acts.checkpoint_bytes + prev_pinned + tokens * terms.per_token + tokens * seq * terms.per_pos
            + seq * seq * terms.mask)
    # autocast's cached casts of trainable fp32 weights (the layers', the adapters'); the head's cast is made
    # at the loss, after the layers (weights.param_plan: under checkpointing it is the backward's part)
    copies = statics.autocast_copies - statics.autocast_copies_backward
    return (statics.earlier_grads, 0, live, copies, prev_held, 0, statics.gathered)
