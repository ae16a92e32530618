"""The saved activations' shape-independent terms, resolved once per run: the kinds of layer
(:class:`LayerKinds`), each kind's ledger flattened into per-token coefficients with the tail outside the
layers (:class:`ActivationTerms`, read by ``activations.saved_at`` at every shape), and, where every kind's
terms are linear in the tokens, the kinds folded (:class:`LinearKinds`).

Folding rests on rounding being monotonic: for ``t > 0`` tokens, ``a <= b`` gives ``fl(t a) <= fl(t b)``,
so ``max(0, max_k fl(t a_k)) = fl(t max(0, max_k a_k))``, the same float64 value (and the same int once
truncated): the largest layer and the largest scratch are one product each at every shape, not a
comparison per kind. The sum over the kinds, ``sum_k fl(fl(t a_k) n_k)``, keeps its order (one folded
coefficient would round differently).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.saved_tensors import DROPOUT_MASK_BYTES, LayerActs
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

# ActivationTerms.kinds' fields read below (the LayerActs fields in a flat tuple)
PER_TOKEN, PER_POS, PINNED, BACKWARD_TEMP, BACKWARD_TEMP_PER_POS, FIXED, BACKWARD_FIXED = 0, 1, 2, 4, 5, 7, 8


@dataclass(frozen=True)
class LayerKinds:
    """The distinct layers of a model under a setup, each with how many times it occurs: what one ledger
    walk per kind of layer gives (``layer_saved.layer_activations``), independent of batch and seq."""

    kinds: tuple[tuple[LayerActs, int], ...]
    # the model config's embedding dropout applies (a mask per token x hidden)
    embedding_dropout: bool = False
    # how many leading kinds hold only layers below every other kind's (up to the first active layer, a
    # kind of its own when its input needs no gradient): back-propagated after all the others
    lower_kinds: int = 0

@dataclass
class ActivationTerms:
    """What :func:`saved_at` needs besides batch and seq, resolved once per run (``activation_terms``);
    read-only by convention, not frozen (as ``memory_statics.MemoryStatics``: cheaper to make).

    ``kinds``: per kind of layer, (per_token, per_token_per_pos, pinned, input_alias, backward_temp,
    backward_temp_per_pos, attn_backward_offset, per_layer, backward_per_layer, backward_per_layer_per_token,
    count), the ``LayerActs`` fields in a flat tuple."""

    kinds: tuple[tuple[float, float, float, float, float, float, float, float, float, float, int], ...]
    head_per_example: bool  # an encoder's classifier head reads one token per example (the pooler)
    tail_per_head_token: int  # bytes x hidden the final norm and the head keep per token they read
    tail_per_token: int  # embedding-dropout mask and a 4-bit lm_head's kept input, per token
    pinned_per_token: int  # a 4-bit lm_head's input, held by bitsandbytes
    checkpointed: bool  # gradient checkpointing
    checkpoint_per_token: int  # residual bytes x hidden x active layers
    offload: bool  # checkpoints (or, without checkpointing, every saved tensor) go to host memory
    model: ModelSpec  # for the embedding backward (a full fine-tune only)
    method: str
    dtypes: Dtypes
    mlp_saved_per_token: float = 0.0  # the largest of the kinds' LayerActs.mlp_saved
    # per token, the largest over the adapted kinds of layer_saved.first_target_terms, the saved part less
    # what aliases the checkpoint (0, 0: not derived, some kind's is not)
    layer_end_per_token: float = 0.0
    layer_end_temp_per_token: float = 0.0
    # of layer_end_per_token, what aliases the checkpoint (kept by the layer itself without checkpointing)
    layer_end_alias_per_token: float = 0.0
    # per token per key position, the largest over those kinds of the eager attention's O(s) saved part kept
    # then (layer_saved.first_target_terms' third term)
    layer_end_per_pos: float = 0.0
    # per token, the largest over the adapted kinds of layer_saved.last_target_terms (0, 0: not derived)
    first_hook_per_token: float = 0.0
    first_hook_temp_per_token: float = 0.0
    lower_kinds: int = 0  # LayerKinds.lower_kinds
    linear: LinearKinds | None = None  # the kinds folded (linear_kinds; None: not linear in the tokens)
    upper_temp_per_token: float | None = None  # upper_temp_per_token (None: not folded)
    # per token, the largest of the kinds' LayerActs.recompute_dequant (recompute_dequant.py)
    recompute_dequant_per_token: float = 0.0


def activation_terms(model: ModelSpec, setup: TrainSetup, dtypes: Dtypes, kinds: LayerKinds, *,
                     gc_offload: bool, quant_saves_input: bool = False,
                     quant_lm_head: bool = False) -> ActivationTerms:
    """The shape-independent terms of :func:`activations_at`: the tail outside the layers (the final norm
    keeps its fp32 input, 4 h per token; lm_head keeps its input when it trains: a classification head
    always trains, PEFT puts it in modules_to_save; BERT has no final norm, its MLM head's transform keeps
    about as much, and its classifier reads the first token only, through the pooler), the embedding
    dropout mask (1 h per token) and a 4-bit lm_head's input (c h per token, kept and pinned)."""
    hidden = model.hidden
    head = 4
    per_token = DROPOUT_MASK_BYTES if kinds.embedding_dropout else 0
    pinned = 0
    if setup.method == "full" or model.head_out:
        head += dtypes.compute if dtypes.autocast else dtypes.norm_out
    elif quant_lm_head and quant_saves_input and setup.quant_bits is not None:
        per_token += dtypes.compute
        pinned = dtypes.compute * hidden
    n_active = (model.n_layers if setup.method != "freeze"
                else min(setup.freeze_trainable_layers, model.n_layers))
    flat = tuple((layer.per_token, layer.per_token_per_pos, layer.pinned, layer.input_alias,
                  layer.backward_temp, layer.backward_temp_per_pos, layer.attn_backward_offset,
                  layer.per_layer, layer.backward_per_layer, layer.backward_per_layer_per_token, count)
                 for layer, count in kinds.kinds)
    offload = ((gc_offload or setup.activation_offload) if setup.gradient_checkpointing
               else setup.activation_offload)
    checkpointed = bool(setup.gradient_checkpointing)
    return ActivationTerms(
        kinds=flat, lower_kinds=kinds.lower_kinds, linear=linear_kinds(flat, checkpointed),
        upper_temp_per_token=upper_temp_per_token(flat, kinds.lower_kinds, checkpointed or offload),
        head_per_example=model.architecture == "encoder" and bool(model.head_out),
        tail_per_head_token=head * hidden, tail_per_token=per_token * hidden, pinned_per_token=pinned,
        checkpointed=checkpointed,
        checkpoint_per_token=dtypes.residual * hidden * n_active, offload=offload,
        model=model, method=setup.method, dtypes=dtypes,
        mlp_saved_per_token=max((layer.mlp_saved for layer, _ in kinds.kinds), default=0.0),
        recompute_dequant_per_token=max((layer.recompute_dequant for layer, _ in kinds.kinds), default=0.0),
        **layer_end_terms(kinds), **first_hook_terms(kinds))


def layer_end_terms(kinds: LayerKinds) -> dict[str, float]:
    """``ActivationTerms``' layer_end_per_token / layer_end_temp_per_token from the kinds' first-target terms
    (layer_saved.first_target_terms): the largest over the kinds with an adapter, none where one is not
    derived."""
    ends = [(layer.first_target_saved, layer.input_alias, layer.first_target_temp, layer.first_target_per_pos)
            for layer, _ in kinds.kinds if layer.first_target_saved]
    if not ends or any(saved < 0 for saved, _, _, _ in ends):
        return {}
    end, alias = max((saved - alias, alias) for saved, alias, _, _ in ends)
    return {"layer_end_per_token": end, "layer_end_alias_per_token": alias,
            "layer_end_temp_per_token": max(temp for _, _, temp, _ in ends),
            "layer_end_per_pos": max(per_pos for _, _, _, per_pos in ends)}


def first_hook_terms(kinds: LayerKinds) -> dict[str, float]:
    """``ActivationTerms``' first_hook_per_token / first_hook_temp_per_token from the adapted kinds'
    last-target terms (layer_saved.last_target_terms): the largest over them, none where one is not
    derived or is the MLP's."""
    hooks = [(layer.last_target_saved, layer.last_target_temp) for layer, _ in kinds.kinds
             if layer.first_target_saved]
    if not hooks or any(saved <= 0 for saved, _ in hooks):
        return {}
    return {"first_hook_per_token": max(saved for saved, _ in hooks),
            "first_hook_temp_per_token": max(temp for _, temp in hooks)}


class LinearKinds(NamedTuple):
    """The kinds of layer folded (module docstring), where no kind has an eager-attention position term, fixed
    per-layer bytes, a fused expert stack's weight gradient or a pinned input, and nothing is
    checkpointed: at ``t`` tokens the layers keep ``sum_k fl(fl(t per_token_k) count_k)``, the largest one
    ``fl(t biggest_per_token)`` and the largest scratch ``fl(t backward_temp_per_token)``. (A named tuple:
    one is made per resolved run, a grid makes one per combination of its other axes.)"""

    counts: tuple[tuple[float, int], ...]  # (per_token, count) of each kind, in the kinds' order
    biggest_per_token: float  # max(0, max_k per_token_k)
    backward_temp_per_token: float  # max(0, max_k backward_temp_k)


def linear_kinds(kinds: tuple[tuple[float, ...], ...], checkpointed: bool) -> LinearKinds | None:
    """The flat ``kinds`` (ActivationTerms.kinds) folded, or None where a term is not linear in the tokens
    (or the run is checkpointed: its recomputation's moment subtracts what aliases the checkpoint, a
    difference rounded per kind)."""
    if checkpointed:
        return None
    for kind in kinds:
        if (kind[PER_POS] or kind[PINNED] or kind[BACKWARD_TEMP_PER_POS] or kind[FIXED]
                or kind[BACKWARD_FIXED]):
            return None
    return LinearKinds(tuple((kind[PER_TOKEN], int(kind[-1])) for kind in kinds),
                       max([0.0, *[kind[PER_TOKEN] for kind in kinds]]),
                       max([0.0, *[kind[BACKWARD_TEMP] for kind in kinds]]))


def upper_temp_per_token(kinds: tuple[tuple[float, ...], ...], lower_kinds: int,
                         not_saved: bool) -> float | None:
    """``ActivationPlan.upper_backward_temp_bytes`` per token, folded: ``max(0, max_k backward_temp_k)``
    over the kinds above the lower ones (None: no lower kind, the layers' activations are not all saved
    (``not_saved``: checkpointed or offloaded; the property reads backward_temp_bytes then), or an upper
    kind's scratch has an eager-attention position term)."""
    if not lower_kinds or not_saved:
        return None
    upper = kinds[lower_kinds:]
    for kind in upper:
        if kind[BACKWARD_TEMP_PER_POS]:
            return None
    return max([0.0, *[kind[BACKWARD_TEMP] for kind in upper]])
