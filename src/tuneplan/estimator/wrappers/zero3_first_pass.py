"""What ZeRO-3 holds in the first pass with a complete module trace, which every run makes (the second
micro-batch) and which max_memory_allocated keeps: DeepSpeed 0.19.8's record pass before it releases the
persistent parameters too, so they join the prefetcher's rounds of large parameters in that pass."""

from __future__ import annotations

from tuneplan.estimator.wrappers.zero3_coordinator import (
    DS_MAX_LIVE_PARAMETERS,
    DS_MAX_REUSE_DISTANCE,
    DS_PARAM_PERSISTENCE_THRESHOLD,
    embedding_used_last,
    forward_trace,
    prefetch_rounds,
    zero3_backward_uses,
    zero3_gathered_ahead,
)
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def zero3_first_pass_embedding_round(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                                     targets: frozenset[str] = frozenset()) -> int:
    """Elements of the all-gather buffer held beside the token embedding from the forward to its backward in
    the first pass with a complete trace (0 when it is not), which every run makes (the second
    micro-batch; max_memory_allocated keeps it).

    DeepSpeed 0.19.8: the first pass records the trace, and in record mode ``release_sub_module`` releases
    every parameter of a module, persistent ones too (the ``ds_persist`` filter is in
    ``__params_to_release``, complete trace only). In the next pass the persistent parameters (at most
    ``stage3_param_persistence_threshold`` elements: norms, biases, a classifier head) are NOT_AVAILABLE
    when the prefetcher meets them, so they join the rounds of the large parameters. When the head is small
    (a classifier) and the prefetcher runs ahead to the embedding's backward use during the forward
    (:func:`prefetch_reach` pops the embedding: everything before it fits under
    ``stage3_max_live_parameters``), the embedding, released after its forward (more than
    ``stage3_max_reuse_distance`` elements before its backward use: the layers two or three times), is
    gathered in one round with the final norm and the head: ``all_gather_coalesced`` gathers into a flat
    buffer and gives each parameter a copy (``AllGatherCoalescedHandle.wait``, ``torch.cat``); the flat
    buffer stays filed under the embedding until its backward fetch. From the next pass the persistent
    parameters stay gathered and the embedding is gathered alone (no copy). (simulate:
    stablelm-base-alpha-3b, 2 layers, LoRA with checkpointing and a 2-label head over 4 GPUs: a
    207.67e6-element buffer beside the embedding's 207.62e6 copy through the second micro-batch's
    backward.)"""
    embed, head = model.embed_params, model.lm_head_params
    # a tied head (``lm_head_params`` 0) is the embedding's weight: the head's forward fetches it, so its
    # next use is there, not in the backward, and no small persistent head starts a round with it
    # (simulate: gemma-2b, 4 layers, freeze with checkpointing over 4 GPUs: the coordinator's count at
    # the loss is the whole model, 9.647e8 elements, and nothing beside it)
    if (not embed or not head or head > DS_PARAM_PERSISTENCE_THRESHOLD or setup.quant_bits is not None
            or not embedding_used_last(model, setup)):
        return 0
    # the module trace between the embedding's two uses: the layers' forward, their checkpointed
    # recompute and their backward, the head's forward and backward
    passes = 3 if setup.gradient_checkpointing else 2
    if passes * (model.params_total - embed - head) + 2 * head < DS_MAX_REUSE_DISTANCE:
        return 0  # the embedding stays gathered from its forward to its backward
    if not zero3_gathered_ahead(model, setup, prefetch_bucket, targets):
        return 0
    queued = zero3_backward_uses(model, setup, targets)
    if queued - embed >= DS_MAX_LIVE_PARAMETERS:
        return 0  # the prefetcher stops at a layer parameter before the embedding
    return embed


def zero3_first_pass_round_in_bottom_layer(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                                           targets: frozenset[str] = frozenset()) -> int:
    """Elements gathered while the bottom decoder layer is back-propagated when the embedding's first-pass
    round (:func:`zero3_first_pass_embedding_round`) is waited for only there (0 otherwise): the bottom
    layer, the embedding's copy and the round's flat buffer.

    ``_fetch_sub_module_impl`` (DeepSpeed 0.19.8) pops one round per module fetch: the forward trace takes
    ``R`` rounds (zero3_coordinator.prefetch_rounds), so the round holding the embedding's backward use is
    popped at fetch ``R + 1``. When that comes after the bottom layer's first linear has run its forward
    (the wrappers above the embedding, the embedding, the layer, its input norm, its attention and the
    linear: zero3_bottom_forward), ``__params_to_release`` has released that layer's linears (their next
    use, in the recompute or the backward, lies beyond ``stage3_max_reuse_distance``): the round is the
    bottom layer's released linears and the embedding, not the final norm and the head. No module of it
    is fetched before the bottom layer's recompute (or backward); until then the flat buffer is those
    parameters' only storage, counted among the gathered ones. There ``AllGatherCoalescedHandle.wait``
    gives each a copy, and the flat buffer stays filed under the embedding until its backward fetch:

    .. math:: G = P_{layer_0} + 2 E

    (the released linears' second elements, in the flat buffer, left out: a lower bound by at most the
    layer). (simulate: Qwen3-8B, 4 layers, freeze with checkpointing and a 2-label head over 2 GPUs: a
    6.643e8-element flat buffer, the embedding and layer 0's attention, from layer 0's forward, and the
    embedding's 6.223e8 copy made at layer 0's recomputed ``q_proj``.)"""
    embed = zero3_first_pass_embedding_round(model, setup, prefetch_bucket, targets)
    if not embed:
        return 0
    rounds = prefetch_rounds(forward_trace(model), prefetch_bucket)
    first = model.layer_groups[0][0].linears[0]
    fetches = (4 if setup.method in ("lora", "qlora") else 2) + 4 + (2 if first.name in targets else 1)
    if len(rounds) + 1 <= fetches:
        return 0  # popped before any layer linear is released: the round of the final norm and the head
    return model.layer_groups[0][0].params + 2 * embed


def zero3_first_pass_round(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                           targets: frozenset[str] = frozenset()) -> tuple[int, int]:
    """(elements of the embedding's first-pass flat buffer held from the forward on, elements gathered in
    the bottom layer's backward when the round is waited for only there): one of the two is 0."""
    at_bottom = zero3_first_pass_round_in_bottom_layer(model, setup, prefetch_bucket, targets)
    if at_bottom:
        return 0, at_bottom
    return zero3_first_pass_embedding_round(model, setup, prefetch_bucket, targets), 0
