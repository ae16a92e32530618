"""What ZeRO-3 holds gathered while the layers below the top are back-propagated, once the prefetcher
has reached the token embedding, the step's last parameter use."""

from __future__ import annotations

from tuneplan.estimator.wrappers.zero3_coordinator import (
    DS_MAX_LIVE_PARAMETERS,
    DS_MAX_REUSE_DISTANCE,
    embedding_used_last,
)
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def zero3_gathered_in_lower_layers(model: ModelSpec, setup: TrainSetup) -> int:
    """Parameters (elements) gathered while a layer below the top is back-propagated once the prefetcher
    has popped the token embedding, the step's last use (0 when it is not the last use).

    ``_fetch_sub_module_impl`` (DeepSpeed 0.19.8) pops until ``n_available`` crosses
    ``stage3_max_live_parameters`` ``M``: once the layers left before the embedding hold less than
    ``M``, the round that crosses pops the embedding ``E`` too. The most gathered is at the highest layer
    ``k`` whose layers ``0..k`` hold under ``M``: those layers and the embedding,

    .. math:: G = \\max_{k:\\ \\sum_{i \\le k} P_i < M} \\sum_{i \\le k} P_i + E

    (simulate: Llama-3.3-70B, 3 layers, LoRA with checkpointing over 8 GPUs: 1.9063e9 elements through
    layer 1's attention backward, layer 0's 8.556e8 and the embedding's 1.0507e9.)"""
    if not embedding_used_last(model, setup):
        return 0
    best = below = 0
    for spec, count in model.layer_groups:
        for _ in range(count):
            below += spec.linear_params + spec.norm_params
            if below < DS_MAX_LIVE_PARAMETERS:
                best = below
    return best + model.embed_params if best else 0


def zero3_embedding_round_held_twice(model: ModelSpec, setup: TrainSetup, targets: frozenset[str],
                                     prefetch_bucket: int) -> int:
    """Parameters (elements) gathered through the bottom layer's backward when the round that pops the
    tied token embedding again, once the head's backward released it (:func:`zero3_gathered_in_lower_layers`
    then), is coalesced with the bottom layer's last queued parameters: the layer, the embedding's copy
    and the round's flat buffer (0 otherwise).

    ``_fetch_sub_module_impl`` (DeepSpeed 0.19.8) pops while ``numel_prefetching < min(max_live -
    n_available, prefetch_bucket)``: a parameter of at least the bucket closes its round, and what the
    queue holds after the last such one before the embedding, under the bucket, opens the embedding's
    round. ``__all_gather_params_`` files that coalesced handle under every parameter of the round; the
    first one's fetch waits for it, ``AllGatherCoalescedHandle.wait`` gives each parameter, the embedding
    too, a copy (``torch.cat(partitions)``) and the flat buffer stays until the round's last parameter,
    the embedding at its own backward fetch, the step's last:

    .. math:: G = P_0 + 2E + \\textstyle\\sum_{\\text{tail}} p

    (simulate: gemma-2-9b, 4 layers, LoRA on the MLP with checkpointing over 4 GPUs: the tied embedding,
    released after the head's backward, popped in layer 3's recomputation with layer 0's ``down_proj``
    ``lora_B``; its 9.176e8-element flat buffer beside its copy made at that ``lora_B``'s fetch in layer
    0's recomputation, through layer 0's backward.)"""
    from tuneplan.estimator.wrappers.zero3_head_reuse import layer_parameters

    # a tied embedding released after the head's backward: its own backward use, past every layer's
    # backward (and recomputation), lies beyond stage3_max_reuse_distance (zero3_tied_backward's rule)
    passes = 2 if setup.gradient_checkpointing else 1
    released = passes * (model.params_total - model.embed_params) >= DS_MAX_REUSE_DISTANCE
    if (model.lm_head_params or not released or setup.quant_bits is not None
            or not zero3_gathered_in_lower_layers(model, setup)):
        return 0
    bottom = model.layer_groups[0][0]
    entries = [n for n, _ in layer_parameters(model, setup, targets, bottom)]
    if not setup.gradient_checkpointing:
        entries.reverse()
    tail: list[int] = []
    for n in entries:
        tail = [] if n >= prefetch_bucket else [*tail, n]
    if not tail or sum(tail) >= prefetch_bucket:
        return 0
    return bottom.linear_params + bottom.norm_params + 2 * model.embed_params + sum(tail)
