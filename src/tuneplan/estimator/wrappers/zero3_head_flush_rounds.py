"""What ZeRO-3 holds gathered when the untied head's gradient is first reduced, counted by the fetch rounds
since the head's release: alone, the prefetcher not run ahead, the two rounds before the final norm's
gradient hook; with the final norm's, the five before the top layer's first gradient hook (DeepSpeed 0.19.8,
``PartitionedParameterCoordinator`` and stage3.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.reduce_buckets import bucket_members, full_backward_gradients
from tuneplan.estimator.wrappers.zero3_coordinator import DS_MAX_LIVE_PARAMETERS, zero3_kept_params
from tuneplan.estimator.wrappers.zero3_loss_crossing import backward_queue
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run

# modules whose pre-backward fetch runs between the head's backward and the final norm's: the base model
# (its output, the final hidden state, is the tensor the head reads) and the final norm, each wrapping
# that tensor in its ``PreBackwardFunctionForModule`` (parameter_offload.py ``_post_forward_module_hook``)
FETCHES_BEFORE_NORM_GRADIENT = 2
# and then before the top layer's first gradient (its last linear's): the decoder layer, its MLP block and
# the linear, each wrapping its output likewise
FETCHES_BEFORE_LAYER_GRADIENT = FETCHES_BEFORE_NORM_GRADIENT + 3


def zero3_head_flush_params(run: Run, prefetch_bucket: int, reduce_bucket: int) -> int:
    """Parameters (elements) gathered when the IPG bucket is first reduced holding the untied head's gradient
    alone, where the prefetcher does not run ahead into the backward (zero3_gathered_ahead is 0); -1 when
    that is not the first reduction or the backward's queue is unknown (routed experts).

    stage3.py ``reduce_independent_p_g_buckets_and_remove_grads``: the head's gradient takes the bucket
    (``bucket.elements`` counts it even when it is not copied in); the next hook, the final norm's, finds
    ``elements + p > reduce_bucket_size`` and reduces the head first, before any decoder layer's backward.
    ``release_sub_module`` freed the head after its backward; since then the base model's and the final
    norm's pre-backward fetches ran (``FETCHES_BEFORE_NORM_GRADIENT``), each ``_fetch_sub_module_impl``
    round popping NOT_AVAILABLE parameters of the backward queue (zero3_loss_crossing.backward_queue) while
    ``numel_prefetching < min(M - n_available, B)``, the last one overshooting; the layers kept from
    forward to backward (zero3_coordinator.zero3_kept_params, ``K``) are AVAILABLE, skipped uncounted:

    .. math:: G = K + \\sum_{r=1}^{2} \\min_j \\{ \\textstyle\\sum_{i \\le j} q^{(r)}_i : \\sum_{i \\le j}
              q^{(r)}_i \\ge B \\}

    (simulate: Llama-3.1-405B, 4 layers, full over 4 GPUs, CPU optimizer: the top layer's down_proj and
    up_proj, 2 x 8.724e8 elements, gathered while the head's 2.1e9-element gradient is reduced.)"""
    model, setup = run.model, run.setup
    head = model.lm_head_params
    fill = bucket_members(full_backward_gradients(model, embedding=False), reduce_bucket)
    if not head or setup.method != "full" or not fill or fill[0] != [head]:
        return -1
    return rounds_params(model, setup, run.targets, prefetch_bucket, FETCHES_BEFORE_NORM_GRADIENT)


def rounds_params(model: ModelSpec, setup: TrainSetup, targets: frozenset[str], prefetch_bucket: int,
                  fetches: int) -> int:
    """Parameters (elements) gathered ``fetches`` module fetches after the untied head's release: the layers
    kept from forward to backward (zero3_coordinator.zero3_kept_params), skipped in the backward queue, and
    each fetch's round; -1 where the queue is unknown (routed experts)."""
    queue = backward_queue(model, setup, targets)[1:]
    if not queue:
        return -1
    kept = zero3_kept_params(model, setup, model.lm_head_params, targets)
    skipped = 0
    # (the kept layers' norms are persistent, in K but not in the queue)
    while queue and skipped + queue[0] <= kept:
        skipped += queue.pop(0)
    held = kept
    for _ in range(fetches):
        popped, room = 0, min(DS_MAX_LIVE_PARAMETERS - held, prefetch_bucket)
        while queue and popped < room:
            popped += queue.pop(0)
        held += popped
    return held


def zero3_head_norm_flush_params(model: ModelSpec, setup: TrainSetup, targets: frozenset[str],
                                 prefetch_bucket: int, reduce_bucket: int) -> int:
    """Parameters (elements) gathered when the IPG bucket is first reduced holding the untied head's and the
    final norm's gradients, from the top decoder layer's first gradient hook, its last linear's (a dense
    MLP projection); -1 otherwise.

    stage3.py ``reduce_independent_p_g_buckets_and_remove_grads``: that gradient does not fit beside the
    two and reduces them first. Since ``release_sub_module`` freed the head the base model's, the final
    norm's, the decoder layer's, its MLP block's and the linear's pre-backward fetches ran
    (``FETCHES_BEFORE_LAYER_GRADIENT``), each round popping while ``numel_prefetching < min(M -
    n_available, B)`` (:func:`rounds_params`): once the head, a large share of ``M``, is released, a few
    rounds of ``B`` refill the count, short of ``M`` plus the largest parameter, the bound with the rounds
    unlimited (zero3_coordinator.zero3_gathered_in_backward).

    .. math:: G = K + \\sum_{r=1}^{5} \\min_j \\{ \\textstyle\\sum_{i \\le j} q^{(r)}_i :
              \\sum_{i \\le j} q^{(r)}_i \\ge \\min(M - G_{r-1}, B) \\}

    (simulate: Yi-1.5-34B, 3 layers, full over 4 GPUs, CPU optimizer and parameters: the top layer kept,
    5.578e8 elements, layer 1's down, up and gate and its o_proj popped by four rounds, the fifth finding
    the count past ``M``: 1.0496e9 elements gathered while the head's and norm's fill is reduced.)"""
    head, norm = model.lm_head_params, model.final_norm_params
    fill = bucket_members(full_backward_gradients(model, embedding=False), reduce_bucket)
    if not (head and norm) or setup.method != "full" or len(fill) < 2 or fill[0] != [head, norm]:
        return -1
    last = model.layer_groups[-1][0].linears[-1]
    if last.role != "mlp" or last.count != 1 or fill[1][0] != last.params:
        return -1
    return rounds_params(model, setup, targets, prefetch_bucket, FETCHES_BEFORE_LAYER_GRADIENT)


def zero3_head_flush_bytes(run: Run, prefetch_bucket: int, reduce_bucket: int, otherwise: int) -> int:
    """Bytes gathered at the head's flush (:func:`zero3_head_flush_params` in the compute dtype), or
    ``otherwise`` where it does not apply (4-bit layers are gathered as packed bytes: not read here)."""
    if run.setup.quant_bits is not None:
        return otherwise
    held = zero3_head_flush_params(run, prefetch_bucket, reduce_bucket)
    if held < 0:
        held = zero3_head_norm_flush_params(run.model, run.setup, run.targets, prefetch_bucket, reduce_bucket)
    return held * run.dtypes.compute if held >= 0 else otherwise
