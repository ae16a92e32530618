"""The backward's prefetch rounds of a QLoRA run under checkpointing whose token embedding, released after
its forward, the forward's prefetcher did not reach: whether the backward pops it in a coalesced round."""

from __future__ import annotations

from tuneplan.estimator.wrappers.zero3_coordinator import DS_MAX_LIVE_PARAMETERS, DS_MAX_REUSE_DISTANCE


def backward_queue(layers: list[list[int]], head: int) -> list[int]:
    """Trace elements of the parameters the backward queues NOT_AVAILABLE before the embedding's backward
    use, in fetch order, ``layers`` the decoder layers' entries bottom to top in forward order.

    A layer's weights are released after its forward (``__params_to_release``, DeepSpeed 0.19.8) when
    their next use, the layer's recompute, lies at least ``stage3_max_reuse_distance`` on: the layers
    above it in the forward, their recompute and backward, and the head's two uses,

    .. math:: 3 \\sum_{j > i} P_j + 2 H \\ge D

    The backward walks the layers top to bottom; a layer's ``down_proj`` (its last linear) is fetched
    first, by its backward hook, whose saved input unpacks the checkpoint and recomputes the layer's
    forward through the others (simulate: Qwen2.5-14B, 4 layers, QLoRA fp4 on q/v: the backward's rounds
    ``[up_2, down_1] [q_1 k_1 v_1 o_1 gate_1] [up_1 down_0] [q_0 k_0 v_0 o_0 gate_0] [up_0, embedding]``)."""
    queue: list[int] = []
    above = 0
    for entries in reversed(layers):
        if entries and 3 * above + 2 * head >= DS_MAX_REUSE_DISTANCE:
            queue += [entries[-1], *entries[:-1]]
        above += sum(entries)
    return queue


def embedding_round_coalesced(layers: list[list[int]], head: int, prefetch_bucket: int) -> bool:
    """Whether the backward's prefetcher pops the embedding in a round with other parameters (so that
    ``AllGatherCoalescedHandle.wait`` gives it a copy beside the flat buffer).

    After the head's backward use releases it, ``_fetch_sub_module_impl`` pops at every fetch a round of at
    least ``min(M - A, prefetch_bucket)`` elements off :func:`backward_queue` followed by the embedding;
    ``A`` holds at most the layers, kept or popped, so while they hold under ``M`` the prefetcher reaches
    the embedding, a round of at least the bucket ``B`` a fetch. The embedding's round holds others
    unless the rounds before it end exactly at the queue's end:

    .. math:: \\text{coalesced} \\iff \\text{the cut of the queue into rounds of} \\ge B
              \\text{ leaves a remainder}"""
    queue = backward_queue(layers, head)
    if not queue or sum(map(sum, layers)) >= DS_MAX_LIVE_PARAMETERS:
        return False  # nothing queued before it, or the limit may stop the prefetcher before it
    taken = 0
    for n in queue:
        taken += n
        if taken >= prefetch_bucket:
            taken = 0
    return taken > 0
