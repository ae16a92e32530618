"""What ZeRO-3 holds gathered when its IPG bucket is first reduced in the backward, and in which layer that
comes: the layers above it back-propagated, their parameters and activations released (DeepSpeed 0.19.8
stage3.py, the order of reduce_buckets.py)."""

from __future__ import annotations

from functools import lru_cache

from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.wrappers.base import Epilogue
from tuneplan.estimator.wrappers.reduce_buckets import (
    backward_turn_gradients,
    backward_turns,
    bucket_fills,
    bucket_members,
    full_backward_gradients,
    zero3_leaf_moe,
)
from tuneplan.estimator.wrappers.zero3_coordinator import (
    DS_NORM_CHUNK,
    embedding_used_last,
    largest_ds_parameter,
    prefetch_reach,
    top_layers_params,
    zero3_backward_uses,
    zero3_gathered_in_backward,
)
from tuneplan.estimator.wrappers.zero3_first_pass import embedding_round_late
from tuneplan.estimator.wrappers.zero3_head_flush_rounds import zero3_head_norm_flush_params
from tuneplan.specs.model import LayerSpec, ModelSpec
from tuneplan.specs.profiles import get_profile
from tuneplan.specs.setup import TrainSetup


def zero3_flush_gathered(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int, reduce_bucket: int,
                         targets: frozenset[str] = frozenset()) -> int:
    """Parameters (elements) gathered at the first in-backward reduction (zero3_bucket_flush > 0), once the
    prefetcher runs ahead: every parameter whose gradient is in the bucket has finished its backward and
    been released (``release_sub_module``), so what is still to be used
    (zero3_coordinator.zero3_gathered_in_backward less those), or the head's own flush
    (zero3_gathered_at_head_flush); not the layers kept at the turn from forward to backward, released by
    then; in the bottom layer (:func:`zero3_flush_layers_above`), after its recompute waited for a late
    round, beside the embedding's copy (zero3_first_pass.embedding_round_late)."""
    filled = zero3_bucket_flush(model, setup, reduce_bucket)
    done = max(filled - (model.lm_head_params if setup.method == "full" else 0), 0)
    head_flush = zero3_gathered_at_head_flush(model, setup, prefetch_bucket, reduce_bucket)
    if head_flush < 0:  # the head's and the final norm's fill, from the top layer's first hook
        head_flush = zero3_head_norm_flush_params(model, setup, targets, prefetch_bucket, reduce_bucket)
    held = head_flush if head_flush >= 0 else zero3_gathered_in_backward(model, setup, done, targets)
    in_bottom = zero3_flush_layers_above(model, setup, reduce_bucket) == model.n_layers - 1
    return held + (embedding_round_late(model, setup, prefetch_bucket, targets) if in_bottom else 0)


def zero3_flush_layers_above(model: ModelSpec, setup: TrainSetup, reduce_bucket: int) -> int:
    """Decoder layers wholly back-propagated before the first in-backward reduction (0 when it comes in the
    top layer or there is none): the gradients in the bucket, less a full fine-tune's head and final norm,
    cover them (their hooks fire in order: reduce_buckets.full_backward_gradients). Their saved activations
    have been released by then (autograd frees a node's saved tensors after its backward)."""
    filled = zero3_bucket_flush(model, setup, reduce_bucket)
    if not filled:
        return 0
    layers = filled - (model.lm_head_params + model.final_norm_params if setup.method == "full" else 0)
    above = 0
    while above < model.n_layers - 1 and top_layers_params(model, above + 1) <= layers:
        above += 1
    return above


def zero3_flush_past_mlp(model: ModelSpec, setup: TrainSetup, reduce_bucket: int) -> bool:
    """Whether the first in-backward reduction comes after its layer's MLP linears have been back-propagated
    (their gradients fire first in the layer): the MLP block's saved tensors are released by then
    (activations.ActivationPlan.mlp_saved_bytes).

    The reduction runs in the hook of the gradient that does not fit (stage3.py, DeepSpeed 0.19.8,
    ``reduce_independent_p_g_buckets_and_remove_grads``, before ``__add_grad_to_ipg_bucket``), a hook that
    fires once that parameter's gradient is made, its linear's backward done (autograd's engine releases a
    node's saved tensors as it returns): the fill's gradients in the layer and that one's cover the MLP.

    .. math:: \\text{past} = [\\, F - H - \\textstyle\\sum_{k \\text{ above}} P_{layer} + n_{next}
              \\ge P_{mlp} ]"""
    filled = zero3_bucket_flush(model, setup, reduce_bucket)
    above = zero3_flush_layers_above(model, setup, reduce_bucket)
    if not filled:
        return False
    head = model.lm_head_params + model.final_norm_params if setup.method == "full" else 0
    turns = zero3_backward_turns(model, setup)
    fill = bucket_members(zero3_backward_gradients(model, setup), reduce_bucket)[0]
    # the gradient whose hook runs the reduction, made by then
    trigger = turns[len(fill)][0] if len(turns) > len(fill) else 0
    in_layer = filled - head - top_layers_params(model, above) + trigger
    return in_layer >= sum(m.params for m in layer_from_top(model, above).linears if m.role == "mlp")


def zero3_flush_mlp_done_scratch(model: ModelSpec, dtypes: Dtypes, reduce_bucket: int,
                                 setup: TrainSetup) -> int:
    """Bytes a token of the reduction layer's scratch at the first reduction (0: not derived, the layer's
    backward scratch counted): past its MLP, or run from its layer's first gradient
    (:func:`zero3_flush_first_hook_scratch`).

    Past the MLP (:func:`zero3_flush_past_mlp`; 0 when its MLP has no linear reading the block's input),
    the MLP's intermediate gradients are gone with its backward; live are the layer output's incoming
    gradient, which autograd's input buffer holds for the residual sum at the layer's input, and the
    gradient of the MLP's input from each linear reading it (gate and up: two, summed by the engine's input
    buffer into a new tensor once both exist).

    .. math:: T = h\\,(b_{res} + n_{in}\\, b_{out})

    (simulate: Pythia-6.9B, 3 layers, full over 2 GPUs, 3 x 512: two 1536 x 4096 bf16 tensors beside the
    first reduction's norm; Mistral-7B-v0.2, 2 layers, 1 x 128: three.)"""
    if not zero3_flush_past_mlp(model, setup, reduce_bucket):
        return zero3_flush_first_hook_scratch(model, dtypes, reduce_bucket, setup)
    above = zero3_flush_layers_above(model, setup, reduce_bucket)
    readers = sum(m.count for m in layer_from_top(model, above).linears
                  if m.role == "mlp" and m.reads == "mlp_in")
    return model.hidden * (dtypes.residual + readers * dtypes.linear_out) if readers else 0


def zero3_flush_first_hook_scratch(model: ModelSpec, dtypes: Dtypes, reduce_bucket: int,
                                   setup: TrainSetup) -> int:
    """Bytes a token of the reduction layer's scratch when the first reduction is run from that layer's
    first gradient, that of its last linear, a dense MLP projection writing the residual stream (the fill
    is the head, the final norm and the layers above, whole); 0 otherwise (not derived).

    The hook fires once the linear's backward returned (``LinearFunctionForZeroStage3.backward``,
    runtime/zero/linear.py; ``reduce_independent_p_g_buckets_and_remove_grads`` runs the reduction before
    ``__add_grad_to_ipg_bucket``): live are the layer output's incoming gradient, which autograd's input
    buffer holds for the residual sum, and the gradient of the linear's input, ``d_in`` wide; nothing else
    of the layer's backward has run (as at a later reduction:
    zero3_lower_flush.lower_flush_scratch_per_token). Net of the linear's saved input (the gated product,
    as wide, in the same dtype; saved by the linear alone: a trained weight or LinearFunctionForZeroStage3),
    which autograd released with its backward:

    .. math:: T = h\\,b_{res} + d_{in}\\,b_{out} - d_{in}\\,b_{out} = h\\,b_{res}

    (simulate: Yi-1.5-34B, 3 layers, full over 4 GPUs, CPU optimizer and parameters, 1 x 2048: the head's
    and final norm's fill reduced from the top layer's down_proj hook, its 2048 x 20480 input gradient and
    the 2048 x 7168 residual gradient beside the reduction's norm, the layer's 2048 x 20480 product gone.)"""
    filled = zero3_bucket_flush(model, setup, reduce_bucket)
    if not filled:
        return 0
    above = zero3_flush_layers_above(model, setup, reduce_bucket)
    head = model.lm_head_params + model.final_norm_params if setup.method == "full" else 0
    last = layer_from_top(model, above).linears[-1]
    if filled - head != top_layers_params(model, above) or last.role != "mlp" or last.count != 1:
        return 0
    # the input gradient, d_in x b_out, takes the place of the released product
    return model.hidden * dtypes.residual


def layer_from_top(model: ModelSpec, k: int) -> LayerSpec:
    """The decoder layer ``k`` below the top (0: the top one)."""
    for spec, count in reversed(model.layer_groups):
        if k < count:
            return spec
        k -= count
    return model.layer_groups[0][0]


def zero3_flush_place(model: ModelSpec, setup: TrainSetup, reduce_bucket: int) -> tuple[int, bool]:
    """(:func:`zero3_flush_layers_above`, :func:`zero3_flush_past_mlp`)."""
    return (zero3_flush_layers_above(model, setup, reduce_bucket),
            zero3_flush_past_mlp(model, setup, reduce_bucket))


def zero3_bucket_flush(model: ModelSpec, setup: TrainSetup, reduce_bucket: int) -> int:
    """Gradient elements in the ZeRO-3 IPG bucket when it is first reduced during the backward; 0 when every
    gradient fits, so that the only reduction is the backward's epilogue, or when the run is not a full
    fine-tune.

    stage3.py (DeepSpeed 0.19.8) ``reduce_independent_p_g_buckets_and_remove_grads``: when the next gradient
    would take the bucket past ``reduce_bucket_size``, ``__reduce_and_partition_ipg_grads`` runs first; with
    ``reduce_scatter`` on (the default) it calls ``__avg_scatter_grads`` -> ``reduce_scatter_coalesced``
    (runtime/comm/coalesced_collectives.py), whose ``torch.cat`` of the interleaved, padded gradient chunks
    is a new tensor of the bucket's elements in the 16-bit dtype, live beside the bucket while the layer is
    back-propagated (the order: :func:`zero3_backward_gradients`)."""
    return first_flush(model, *zero3_backward_kind(model, setup), reduce_bucket)


@lru_cache(maxsize=256)
def first_flush(model: ModelSpec, full: bool, k: int, leaf: bool, reduce_bucket: int) -> int:
    """:func:`zero3_bucket_flush` from what it reads of the setup (:func:`zero3_backward_kind`, never the
    batch shape): kept per model and kind, every ZeRO-3 formula of a setup asks it."""
    fills = bucket_fills(list(backward_turn_gradients(model, full, k, leaf)), reduce_bucket)
    return fills[0] if len(fills) > 1 else 0


def zero3_backward_gradients(model: ModelSpec, setup: TrainSetup) -> list[int]:
    """The gradients (elements) of one backward up to the bottom layer in the order they reach the bucket
    (:func:`zero3_backward_turns`)."""
    return list(backward_turn_gradients(model, *zero3_backward_kind(model, setup)))


def zero3_backward_turns(model: ModelSpec, setup: TrainSetup) -> list[tuple[int, int]]:
    """(elements, elements of gradients live at its turn) of each gradient of one backward up to the bottom
    layer, in the order their hooks fire: a full fine-tune's (reduce_buckets.full_backward_gradients), a
    freeze run's trained top layers (no head: weights.trainable_params; simulate: Mistral-Nemo, 4 layers,
    2 trained over 2 GPUs: a first reduction of 4.928e8 elements, layer 3 and layer 2's MLP); none
    otherwise (LoRA's fit the bucket). A gradient is alone at its turn, except in a leaf MoE block
    (reduce_buckets.leaf_layer_turns), whose gradients are all made before the first is handled."""
    return list(backward_turns(model, *zero3_backward_kind(model, setup)))


def zero3_backward_kind(model: ModelSpec, setup: TrainSetup) -> tuple[bool, int, bool]:
    """What :func:`zero3_backward_turns` reads of the setup: (a full fine-tune, the trained layers from the
    top, leaf MoE blocks); no layer for a run that is neither full nor a freeze run."""
    full, freeze = setup.method == "full", setup.method == "freeze"
    k = model.n_layers if full else min(setup.freeze_trainable_layers, model.n_layers) if freeze else 0
    return full, k, zero3_leaf_moe(model, get_profile(setup.framework).model_code == "hf")


def zero3_gathered_at_head_flush(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                                 reduce_bucket: int) -> int:
    """Parameters (elements) gathered when the IPG bucket is first reduced holding the untied output head's
    gradient alone (the head fills the bucket: the final norm's gradient, the next, triggers the reduction
    right after the head's backward); -1 when the first reduction is not that one.

    ``PartitionedParameterCoordinator`` (DeepSpeed 0.19.8): ``release_sub_module`` frees the head after its
    backward, and before the final norm's gradient is ready only the final norm's own fetch has run: one
    prefetch round of ``_fetch_sub_module_impl``, which pops until it has taken ``prefetch_bucket``
    elements (the last parameter overshooting), or, when what is left before the embedding is less, the
    rest of the queue, embedding included (:func:`prefetch_reach`). What is gathered is what the loss held
    (:func:`zero3_gathered_ahead`) less the head, plus that round."""
    head = model.lm_head_params
    fill = bucket_members(full_backward_gradients(model, embedding=False), reduce_bucket)
    if not head or setup.method != "full" or not fill or fill[0] != [head]:
        return -1
    queued = zero3_backward_uses(model, setup) - head
    held = max(prefetch_reach(model, setup, queued + head) - head, 0)
    rest = queued - held
    tail = model.embed_params if embedding_used_last(model, setup) else 0
    if rest - tail < prefetch_bucket:
        return queued
    largest = largest_ds_parameter(model, get_profile(setup.framework).model_code == "hf")
    return held + prefetch_bucket + largest


def offload_boundary_scratch(setup: TrainSetup, partition: int, compute: int) -> int:
    """Bytes ``_offload_grad_partition_at_boundary`` (DeepSpeed 0.19.8 stage3.py, ``offload_optimizer`` at
    the accumulation boundary) holds at once for a gradient partition of ``partition`` elements (0 without
    the CPU optimizer). It first takes the partition's norm (``_constant_buffered_norm2``: chunks of
    ``buffer_size`` = 2.5e8 elements, each ``.to(get_norm_dtype())``, fp64, freed before the next), then
    casts the whole partition to ``master_weights_and_grads_dtype`` (fp32) on the device for the copy into
    the CPU optimizer's flat gradient (``fp32_grad_tensor.copy_(grad_buffer.to(dtype=...))``), a new tensor
    unless the gradient is fp32 already; the two are never live together:

    .. math:: S = \\max(8 \\min(p, 2.5 \\cdot 10^8),\\ 4 p\\,[c \\neq 4])

    so the cast is the larger from a partition of 5e8 elements on. (simulate: Qwen2.5-72B, 2 layers, full
    over 2 GPUs, CPU optimizer and parameters: the embedding's 622,854,144-element partition cast to fp32,
    2.49e9 bytes, beside its 16-bit gradient and gathered weight in the epilogue, the step's peak.)"""
    if setup.offload not in ("optimizer", "all"):
        return 0
    return max(8 * min(partition, DS_NORM_CHUNK), 4 * partition if compute != 4 else 0)


def zero3_flush_scratch(model: ModelSpec, setup: TrainSetup, reduce_bucket: int, compute: int) -> int:
    """Bytes beside the bucket while its first reduction in the backward runs (zero3_bucket_flush; 0 when
    there is none): the reduce-scatter's interleaved copy, and with ``offload_optimizer`` the fp64 chunk of
    a gradient partition's norm.

    DeepSpeed 0.19.8: ``__reduce_and_partition_ipg_grads`` -> ``__avg_scatter_grads`` ->
    ``reduce_scatter_coalesced`` (runtime/comm/coalesced_collectives.py) ``torch.cat``-s the padded chunks
    of the fill's ``n`` gradients into a new flat tensor of ``sum ceil(P_i / N) N`` elements, except for
    one gradient divisible by ``N``, which it reduces in place (``tensors[0].view(-1)``); the partitions it
    returns are views of that tensor, live through ``partition_grads``. There, with ``offload_optimizer``,
    at the accumulation boundary, ``_offload_grad_partition_at_boundary`` -> ``_constant_buffered_norm2``
    takes each partition's norm chunk by chunk of ``buffer_size`` = 2.5e8 elements converted to fp64
    (zero/utils.py ``get_norm_dtype``): ``8 min(ceil(P_max / N), 2.5e8)`` bytes at once, or the partition's
    fp32 cast after it when larger (:func:`offload_boundary_scratch`)."""
    if not zero3_bucket_flush(model, setup, reduce_bucket):
        return 0
    turns = zero3_backward_turns(model, setup)
    members = bucket_members(zero3_backward_gradients(model, setup), reduce_bucket)
    fill, ws = members[0], setup.world_size
    single = len(fill) == 1 and fill[0] % ws == 0
    copy = 0 if single else sum(-(-n // ws) * ws for n in fill) * compute
    # a gradient larger than the bucket is not copied into it (``__add_grad_to_ipg_bucket`` copies only
    # what fits): its own tensor lives until ``partition_grads`` drops ``param.grad``
    own = fill[0] * compute if fill[0] > reduce_bucket else 0
    norm = offload_boundary_scratch(setup, -(-max(fill) // ws), compute)
    # the gradient whose hook runs the reduction (``reduce_independent_p_g_buckets_and_remove_grads``, before
    # ``__add_grad_to_ipg_bucket`` copies it in): its ``param.grad`` live beside it, with those of its leaf
    # MoE block still to be handled (zero3_backward_turns)
    return own + copy + norm + turns[len(fill)][1] * compute


def zero3_epilogue(model: ModelSpec, setup: TrainSetup, reduce_bucket: int, compute: int,
                   buffers: int) -> Epilogue | None:
    """A full fine-tune's last reduction of the IPG bucket, at the backward's end, every activation
    released, beside ``buffers`` (the bucket, the flat gradient partition on the device; None otherwise:
    LoRA's gradients are a sliver of the bucket, a freeze run's end is not derived).

    DeepSpeed 0.19.8, stage3.py: ``independent_gradient_partition_epilogue`` ->
    ``__reduce_and_partition_ipg_grads`` reduces what the bucket holds after the last gradient, the token
    embedding's (reduce_buckets.bucket_members over the whole backward, the embedding included), as
    :func:`zero3_flush_scratch` reads the first reduction: ``reduce_scatter_coalesced``'s ``torch.cat``
    of the padded chunks (``sum ceil(P_i / N) N`` elements in the 16-bit dtype, none for a single gradient
    divisible by ``N``), and with ``offload_optimizer`` ``_constant_buffered_norm2``'s fp64 chunk,
    ``8 min(ceil(P_max / N), 2.5e8)`` bytes, or the partition's fp32 cast when larger
    (:func:`offload_boundary_scratch`). Beside them the bucket and what is still gathered: the
    embedding, whose weight its backward fetched and which no post-backward hook releases (its input, the
    token ids, does not require grad, so DeepSpeed's backward-release function never runs on it; the
    coordinator's ``release_and_reset_all`` frees it after the step):

    .. math:: M_{epi} = 2\\,\\text{cat} + 8\\,\\text{chunk} + 2E \\quad (\\text{16-bit})

    When the embedding's gradient does not fit beside the fill before it, its own hook
    (``reduce_independent_p_g_buckets_and_remove_grads``) reduces that fill first, every activation
    released, the embedding's gradient live beside the copy and the chunk (``2\\,\\text{cat}' + 8\\,
    \\text{chunk}' + 2E``); the row takes the larger moment (simulate: Llama-2-7b, 2 layers, a 1-label
    classifier in fp32 over 4 GPUs, CPU optimizer: the layers' 4.048e8-element copy beside the embedding's
    gradient and its gathered weight).

    (simulate: phi-2, 3 layers, full with checkpointing over 8 GPUs, CPU optimizer: the 4.982e8-element
    copy, the 1.6384e7-element fp64 chunk and the gathered embedding beside the bucket in the epilogue's
    norm.)"""
    if setup.method != "full" or not model.embed_params:
        return None
    members = bucket_members(full_backward_gradients(model), reduce_bucket)
    last = members[-1]
    ws = setup.world_size
    single = len(last) == 1 and last[0] % ws == 0
    copy = 0 if single else sum(-(-n // ws) * ws for n in last) * compute
    # a gradient larger than the bucket is not copied into it: its own tensor lives until partition_grads
    own = last[0] * compute if len(last) == 1 and last[0] > reduce_bucket else 0
    norm = offload_boundary_scratch(setup, -(-max(last) // ws), compute)
    moment = own + copy + norm
    if len(members) > 1 and last == [model.embed_params]:
        # the embedding's gradient, the last, did not fit: its hook reduced the fill before it, beside it
        before = members[-2]
        copy = sum(-(-n // ws) * ws for n in before) * compute
        if len(before) == 1 and before[0] % ws == 0:
            copy = before[0] * compute if before[0] > reduce_bucket else 0
        norm = offload_boundary_scratch(setup, -(-max(before) // ws), compute)
        moment = max(moment, copy + norm + model.embed_params * compute)
    return Epilogue(gradients=buffers, reduction_copy=moment, gathered=model.embed_params * compute)
