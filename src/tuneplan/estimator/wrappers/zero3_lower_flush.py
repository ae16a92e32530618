"""ZeRO-3's later in-backward reductions of the IPG bucket, in a layer below the top: the reduce-scatter's
copy of the fill and its trigger's gradient beside the lower layers gathered with the token embedding the
prefetcher popped (DeepSpeed 0.19.8 stage3.py; the first reduction: zero3_flush.py)."""

from __future__ import annotations

from functools import lru_cache

from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.wrappers.reduce_buckets import (
    backward_turn_gradients,
    bucket_members,
    layer_hook_order,
)
from tuneplan.estimator.wrappers.zero3_coordinator import DS_MAX_LIVE_PARAMETERS, embedding_used_last
from tuneplan.estimator.wrappers.zero3_flush import (
    layer_from_top,
    offload_boundary_scratch,
    zero3_backward_kind,
)
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def reduction_scratch(setup: TrainSetup, fill: list[int], trigger: int, reduce_bucket: int,
                      compute: int) -> int:
    """Bytes one in-backward reduction of ``fill`` (its gradients' elements) holds beside the bucket,
    run from the hook of the ``trigger`` gradient (elements), whose ``param.grad`` is live beside it.

    ``__reduce_and_partition_ipg_grads`` -> ``__avg_scatter_grads`` -> ``reduce_scatter_coalesced``
    (runtime/comm/coalesced_collectives.py) ``torch.cat``-s the padded chunks into a new flat tensor of
    ``sum ceil(P_i / N) N`` elements (none for one gradient divisible by ``N``: reduced in place); its
    partitions are views of it through ``partition_grads``, where with ``offload_optimizer`` the norm's
    fp64 chunk or the partition's fp32 cast is made (zero3_flush.offload_boundary_scratch). A gradient
    over the bucket was never copied into it: its own tensor is live until ``partition_grads``.

    .. math:: S = c \\textstyle\\sum_i \\lceil P_i / N \\rceil N + \\text{norm} + c\\,P_{trigger}"""
    ws = setup.world_size
    single = len(fill) == 1 and fill[0] % ws == 0
    copy = 0 if single else sum(-(-n // ws) * ws for n in fill) * compute
    own = fill[0] * compute if len(fill) == 1 and fill[0] > reduce_bucket else 0
    norm = offload_boundary_scratch(setup, -(-max(fill) // ws), compute)
    return own + copy + norm + trigger * compute


def zero3_later_reductions(model: ModelSpec, setup: TrainSetup,
                           reduce_bucket: int) -> list[tuple[int, list[int], int]]:
    """(decoder layer, from the bottom, whose backward runs it; the fill's gradients; the trigger's
    elements) of each in-backward reduction after the first whose trigger is made below the top layer.

    ``reduce_independent_p_g_buckets_and_remove_grads`` reduces the bucket from the hook of the gradient
    that does not fit (reduce_buckets.bucket_members over zero3_flush.zero3_backward_gradients, the head,
    the final norm, then each layer from the top); the last fill waits for the embedding's hook or the
    epilogue (zero3_flush.zero3_epilogue). A leaf MoE block's turns are not placed here (empty)."""
    walk = later_reductions_walk(model, *zero3_backward_kind(model, setup), reduce_bucket)
    return [(layer, list(fill), trigger) for layer, fill, trigger in walk[0]]


@lru_cache(maxsize=256)
def later_reductions_walk(model: ModelSpec, full: bool, k: int, leaf: bool, reduce_bucket: int
                          ) -> tuple[tuple[tuple[int, tuple[int, ...], int], ...], int]:
    """(:func:`zero3_later_reductions`, the widest input of a reduction's trigger linear for
    :func:`lower_flush_scratch_per_token`, 0 where one is not a dense MLP projection run first in its
    layer) from what they read of the setup (zero3_flush.zero3_backward_kind: never the batch shape), one
    walk kept per model and kind."""
    if leaf:
        return (), 0
    order = backward_turn_gradients(model, full, k, leaf)
    members = bucket_members(list(order), reduce_bucket)
    owner = _gradient_layers(model, full)
    out: list[tuple[int, tuple[int, ...], int]] = []
    widths: list[int] = []
    mixed = False
    at = len(members[0]) if members else 0
    for fill in members[1:-1]:
        at += len(fill)
        above = owner[at]
        if above < 1:
            continue
        out.append((model.n_layers - 1 - above, tuple(fill), order[at]))
        last = layer_from_top(model, above).linears[-1]
        mixed = mixed or owner[at - 1] == above or last.role != "mlp" or last.count != 1
        widths.append(last.params // model.hidden)
    return tuple(out), 0 if mixed or not widths else max(widths)


def _gradient_layers(model: ModelSpec, full: bool) -> list[int]:
    """The decoder layer (from the top) of each gradient of zero3_flush.zero3_backward_gradients, in hook
    order; a full fine-tune's head and final norm -1."""
    owner = [-1] * (len([n for n in (model.lm_head_params, model.final_norm_params) if n]) if full else 0)
    k = 0
    for spec, count in reversed(model.layer_groups):
        hooks = len([n for n in layer_hook_order(spec) if n])
        for _ in range(count):
            owner += [k] * hooks
            k += 1
    return owner


def lower_flush_scratch_per_token(model: ModelSpec, setup: TrainSetup, reduce_bucket: int,
                                  dtypes: Dtypes) -> int:
    """Bytes a token of the layer's scratch at the later reductions' moments when every one is run from
    its layer's first gradient, that of its last linear, a dense MLP projection writing the residual
    stream (0 otherwise: the layer's backward scratch counted, an upper bound).

    That hook fires once the linear's backward returned (``LinearFunctionForZeroStage3.backward``,
    runtime/zero/linear.py): live are the layer output's incoming gradient, which autograd's input buffer
    holds for the residual sum, and the gradient of the linear's input, ``d_in`` wide; nothing else of the
    layer's backward has run.

    .. math:: T = h\\,b_{res} + d_{in}\\,b_{out}

    (simulate: Qwen2.5-32B, 4 layers, full in fp32 over 8 GPUs, 1 x 1024: down_proj's 1024 x 27648 input
    gradient and the 1024 x 5120 residual gradient beside the reduction's norm.)"""
    widest = later_reductions_walk(model, *zero3_backward_kind(model, setup), reduce_bucket)[1]
    return model.hidden * dtypes.residual + widest * dtypes.linear_out if widest else 0


def zero3_lower_flush_moment(model: ModelSpec, setup: TrainSetup, reduce_bucket: int, dtypes: Dtypes,
                             in_layers: int, runs_ahead: bool) -> tuple[int, int]:
    """(:func:`zero3_lower_flush`, :func:`lower_flush_scratch_per_token`), over one walk of the reductions."""
    reductions = zero3_later_reductions(model, setup, reduce_bucket)
    return (zero3_lower_flush(model, setup, reduce_bucket, dtypes.compute, in_layers, runs_ahead, reductions),
            lower_flush_scratch_per_token(model, setup, reduce_bucket, dtypes))


def lower_layers_gathered(model: ModelSpec, setup: TrainSetup, layer: int) -> int:
    """Parameters (elements) gathered in decoder ``layer`` (from the bottom)'s backward once the prefetcher
    popped the token embedding, the step's last use (zero3_lower_layers.zero3_gathered_in_lower_layers'
    rule at one layer): layers ``0..layer`` and the embedding while they hold under
    ``stage3_max_live_parameters`` ``M``; 0 otherwise.

    .. math:: G_j = \\textstyle\\sum_{i \\le j} P_i + E \\quad [\\sum_{i \\le j} P_i < M]"""
    if not embedding_used_last(model, setup):
        return 0
    below = seen = 0
    for spec, count in model.layer_groups:
        for _ in range(count):
            if seen > layer:
                break
            below += spec.linear_params + spec.norm_params
            seen += 1
    return below + model.embed_params if below < DS_MAX_LIVE_PARAMETERS else 0


def zero3_lower_flush(model: ModelSpec, setup: TrainSetup, reduce_bucket: int, compute: int, in_layers: int,
                      runs_ahead: bool, reductions: list[tuple[int, list[int], int]] | None = None) -> int:
    """Bytes gathered and held by the largest later in-backward reduction in a lower layer
    (:func:`zero3_later_reductions`; 0 when there is none): what is gathered in that layer
    (:func:`lower_layers_gathered`, or ``in_layers`` bytes, the layers' own, before the prefetcher reaches
    the embedding, or when it does not run ahead) and the reduction's scratch (:func:`reduction_scratch`).

    (simulate: Qwen2.5-32B, 4 layers, full with checkpointing in fp32 over 8 GPUs, CPU optimizer and
    parameters: layer 2's 487,605,248-element fill copied in layer 1's backward, from down_proj's hook,
    beside layers 1 and 0 and the 778,567,680-element embedding gathered and the fp64 norm chunk;
    Llama-3.1-70B, 2 layers, freeze with checkpointing in fp16 over 4 GPUs, the prefetcher not running
    ahead: layer 1's 385,892,352-element tail copied from layer 0's down_proj hook beside layer 0 and the
    embedding popped in its recomputation.)"""
    best = 0
    if reductions is None:
        reductions = zero3_later_reductions(model, setup, reduce_bucket)
    for layer, fill, trigger in reductions:
        # not running ahead, the prefetcher still pops the embedding in the bottom layer's recomputation:
        # at its last fetch the queue up to the embedding holds only that layer's parameters, AVAILABLE,
        # popped without counting (``_fetch_sub_module_impl``), then the embedding, under max_live
        reaches = runs_ahead or (layer == 0 and bool(setup.gradient_checkpointing))
        popped = lower_layers_gathered(model, setup, layer) * compute if reaches else 0
        gathered = max(popped, in_layers)
        best = max(best, gathered + reduction_scratch(setup, fill, trigger, reduce_bucket, compute))
    return best
