"""The token embedding's backward round under ZeRO-3: what the prefetcher gathers for the embedding's
backward use once it has released the embedding after its forward. In the first pass with a complete module
trace, which every run makes (the second micro-batch) and which max_memory_allocated keeps, DeepSpeed
0.19.8's record pass before it has released the persistent parameters too, so they join the prefetcher's
rounds of large parameters (a small classifier head with the embedding); in every pass, the bottom layer's
linears released after their forward join it when the prefetcher reaches the embedding only then."""

from __future__ import annotations

from tuneplan.estimator.compute import has_rotary
from tuneplan.estimator.wrappers.base import EmbeddingGradients
from tuneplan.estimator.wrappers.zero3_coordinator import (
    DS_MAX_LIVE_PARAMETERS,
    DS_MAX_REUSE_DISTANCE,
    DS_PARAM_PERSISTENCE_THRESHOLD,
    embedding_used_last,
    forward_trace,
    prefetch_rounds,
    zero3_backward_uses,
    zero3_gathered_ahead,
    zero3_head_round,
)
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def embedding_regathered(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                         targets: frozenset[str] = frozenset()) -> bool:
    """Whether the untied model's embedding, released after its forward, is gathered again for its backward
    use by a prefetch round popped during the forward (the conditions of
    :func:`zero3_first_pass_embedding_round` but the head's size)."""
    embed, head = model.embed_params, model.lm_head_params
    # a tied head (``lm_head_params`` 0) is the embedding's weight: the head's forward fetches it, so its
    # next use is there, not in the backward (simulate: gemma-2b, 4 layers, freeze with checkpointing over
    # 4 GPUs: the coordinator's count at the loss is the whole model, 9.647e8 elements, and nothing beside it)
    if not embed or not head or setup.quant_bits is not None or not embedding_used_last(model, setup):
        return False
    if not embedding_released_after_forward(model, setup):
        return False  # the embedding stays gathered from its forward to its backward
    if not zero3_gathered_ahead(model, setup, prefetch_bucket, targets):
        return False
    # else the prefetcher stops at a layer parameter before the embedding
    return zero3_backward_uses(model, setup, targets) - embed < DS_MAX_LIVE_PARAMETERS


def embedding_released_after_forward(model: ModelSpec, setup: TrainSetup) -> bool:
    """Whether ``__params_to_release`` (DeepSpeed 0.19.8, complete trace) frees the token embedding after
    its forward: with no backward use (not zero3_coordinator.embedding_used_last), or when its backward
    use lies ``stage3_max_reuse_distance`` ``D`` elements or more down the module trace, the layers'
    forward, their checkpointed recompute and their backward, the untied head's forward and backward
    between them:

    .. math:: n (P - E - P_{head}) + 2 P_{head} \\ge D, \\quad n = 3 \\text{ (checkpointing) or } 2

    A tied head's forward uses the embedding's weight right after the layers, whatever the backward:
    released when those, ``P - E``, reach ``D``. (simulate: gemma-7b, 2 layers, freeze with checkpointing
    and a 1-label head over 2 GPUs, and Mistral-Nemo, 2 layers, freeze with checkpointing over 4 GPUs: the
    embedding gathered by the root's fetch and freed at its own forward's end, 1.66e9 and 2.98e9 elements
    before its backward use; gemma-7b, 4 layers, tied, freeze over 4 GPUs: 1.107e9 elements of layers
    before the head's forward.)"""
    embed, head = model.embed_params, model.lm_head_params
    if not head and model.tied_embeddings:
        return model.params_total - embed >= DS_MAX_REUSE_DISTANCE
    if not embedding_used_last(model, setup):
        return True
    if not head:
        return False
    passes = 3 if setup.gradient_checkpointing else 2
    return passes * (model.params_total - embed - head) + 2 * head >= DS_MAX_REUSE_DISTANCE


def head_round_before_first_step(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                                 targets: frozenset[str] = frozenset()) -> bool:
    """Whether the untied head's round held twice at its forward (zero3_coordinator.zero3_head_round) is
    the ``[final norm, head]`` one, coalesced only in the first pass with a complete trace (the record pass
    released the norm): with several micro-batches a step, that pass is the first step's second one, before
    the optimizer's first ``step()`` makes its states (zero_terms.DeepSpeedTerms.lazy_states; the fp32
    master partition is made at initialization). With one micro-batch a step it is the
    second step's, the norm gathered again by ``_post_step``: the head is alone, no such round. (simulate:
    Qwen3-8B, 4 layers, freeze of the top 2 with checkpointing in fp32 over 4 GPUs, two micro-batches: the
    6.2233e8-element round beside the head's copy at ``model.norm`` of the first step, no Adam state made.)"""
    head, norm = model.lm_head_params, model.final_norm_params
    return (setup.grad_accum > 1 and head > 0 and 0 < norm and setup.quant_bits is None
            and zero3_head_round(model, prefetch_bucket, setup, targets) == head + norm)


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
    backward.)

    With one micro-batch per step the first pass with a complete trace is the second step's, and
    ``DeepSpeedZeroOptimizer_Stage3._post_step`` has gathered the persistent parameters again after the
    first step: the embedding's round is what the forward trace's last round left of the partitioned
    parameters (:func:`embedding_round_after_step`)."""
    if model.lm_head_params > DS_PARAM_PERSISTENCE_THRESHOLD:
        return 0  # an LM head ends its own round before the embedding's
    if not embedding_regathered(model, setup, prefetch_bucket, targets):
        return 0
    if setup.grad_accum < 2:
        return embedding_round_after_step(model, setup, prefetch_bucket, targets)
    return model.embed_params


def embedding_round_after_step(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                               targets: frozenset[str] = frozenset()) -> int:
    """Elements of the flat buffer of the embedding's backward round in the second step's forward, when
    the persistent parameters (the final norm, a classifier head, LoRA matrices of at most
    ``stage3_param_persistence_threshold`` elements) are gathered since the first step's ``_post_step``:
    0 when the embedding is alone in its round.

    The prefetcher's queue after the forward trace's partitioned parameters
    (zero3_coordinator.forward_trace, the head left out) holds the embedding's backward use; the round
    that pops it begins with what the previous round left (:func:`prefetch_rounds`). Alone, it is
    gathered into its own storage (``all_gather_coalesced``'s single-parameter path: no flat buffer, no
    copy), already counted among the gathered parameters; after the top layer's last partitioned
    parameter ``p`` (a LoRA ``lora_B`` over the threshold), the round is coalesced and its flat buffer
    is held beside the copies until the embedding's backward fetch. (simulate: Llama-3.1-8B,
    2 layers, LoRA of rank 8 with checkpointing and a 2-label head over 2 GPUs: the 525.34e6-element
    embedding alone, popped at layer 0's input norm; Yi-1.5-6B, 3 layers, rank 128: a 262.67e6-element
    flat buffer, the embedding and the top ``down_proj``'s 524,288-element ``lora_B``.)

    .. math:: G = \\begin{cases} 0 & \\text{alone} \\\\ E + p & \\text{coalesced} \\end{cases}"""
    lora = setup.method == "lora"
    trace = forward_trace(model, setup.rank if lora else 0, targets)
    if model.lm_head_params and trace and trace[-1] == model.lm_head_params:
        trace = trace[:-1]  # the head is persistent here (its size is checked by the caller)
    rounds = prefetch_rounds([*trace, model.embed_params], prefetch_bucket)
    if sum(map(len, rounds)) < len(trace) + 1 or len(rounds[-1]) < 2:
        return 0
    return sum(rounds[-1])


def embedding_round_late(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                         targets: frozenset[str] = frozenset()) -> int:
    """Elements of the token embedding whose backward round is popped only after the bottom layer's first
    linear has been released, under checkpointing (0 otherwise).

    ``_fetch_sub_module_impl`` (DeepSpeed 0.19.8) pops one round per module fetch: the forward trace takes
    ``R`` rounds (zero3_coordinator.prefetch_rounds, cut against ``stage3_max_live_parameters`` without
    the embedding once its forward is over: :func:`embedding_released_after_forward`), so the round holding
    the embedding's backward use (:func:`embedding_regathered`) is popped at fetch ``R + 1``. When that
    comes after the bottom layer's first linear has run its forward (the wrappers above the embedding, the
    embedding, the model-level rotary module, the layer, its input norm, its attention and the linear:
    zero3_bottom_forward), ``__params_to_release`` has released
    that layer's linears run so far (their next use is the recompute, beyond
    ``stage3_max_reuse_distance``): the round is those linears and the embedding, coalesced, whatever the
    head. No module of it is fetched before the bottom layer's recompute; until then the flat buffer is
    those parameters' only storage, counted among the gathered ones. There ``AllGatherCoalescedHandle.
    wait`` gives each a copy, and the flat buffer stays filed under the embedding until its backward
    fetch. (simulate: Qwen3-8B, 4 layers, freeze with a 2-label head over 2 GPUs: a 6.643e8-element flat
    buffer, the embedding and layer 0's attention, from layer 0's forward, the embedding's 6.223e8 copy
    made at layer 0's recomputed ``q_proj``; Mistral-7B, 2 layers, full over 4 GPUs: the embedding and
    ``q_proj``, 1.510e8, popped at ``k_proj``.) Without checkpointing the released linears are fetched
    again last in the bottom layer's backward: left out."""
    if not setup.gradient_checkpointing or not embedding_regathered(model, setup, prefetch_bucket, targets):
        return 0
    # the wrappers' rounds and the embedding's own are popped before its release after its forward
    # takes it off ``n_available`` (:func:`embedding_released_after_forward`)
    wrappers = 4 if setup.method in ("lora", "qlora") else 2
    rounds = prefetch_rounds(forward_trace(model), prefetch_bucket, (wrappers + 1, model.embed_params))
    first = model.layer_groups[0][0].linears[0]
    # and the model-level rotary module's fetch after the embedding (zero3_bottom_forward)
    fetches = wrappers + 4 + (1 if has_rotary(model) else 0) + (2 if first.name in targets else 1)
    if len(rounds) + 1 <= fetches:
        return 0  # popped before any layer linear is released (a classifier's: the final norm and the head)
    return model.embed_params


def zero3_first_pass_round(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                           targets: frozenset[str] = frozenset()) -> tuple[int, int]:
    """(elements of the embedding's flat buffer held from the forward on, elements gathered while the bottom
    layer is back-propagated when the round is waited for only there): one of the two is 0.

    A round popped late (:func:`embedding_round_late`) holds, from the bottom layer's recompute, the
    layer, the embedding's copy and the flat buffer:

    .. math:: G = P_{layer_0} + 2 E

    (the released linears' second elements, in the flat buffer, left out: a lower bound by at most the
    layer); else the first pass's round of a small head (:func:`zero3_first_pass_embedding_round`)."""
    late = embedding_round_late(model, setup, prefetch_bucket, targets)
    if late:
        return 0, model.layer_groups[0][0].params + 2 * late
    return zero3_first_pass_embedding_round(model, setup, prefetch_bucket, targets), 0


def zero3_embedding_backward(model: ModelSpec, setup: TrainSetup, persistent: int,
                             compute: int) -> EmbeddingGradients | None:
    """A full fine-tune's token-embedding backward, the last of the step: its module's pre-backward hook
    gathers its weight whole (PartitionedParameterCoordinator.fetch_sub_module fetches every parameter of
    the module, DeepSpeed 0.19.8) beside ``persistent`` (the IPG bucket and the flat gradient partition);
    the gradient and its scratch (a tied head's sum) are the row's own. None for other methods."""
    if setup.method != "full" or not model.embed_params:
        return None
    return EmbeddingGradients(persistent + model.embed_params * compute, layers_hold_it=False)
