"""ZeRO-2's gradient partition made in the layers' backward, and the one an accumulation keeps beside it.

DeepSpeed 0.19.8, ``runtime/zero/stage_1_and_2.py``, without offload:

- each gradient's hook (``reduce_independent_p_g_buckets_and_remove_grads``) first reduces what the IPG
  bucket holds when the new gradient would take it past ``reduce_bucket_size`` (``reduce_ipg_grads``), then
  copies the new gradient into the bucket; a gradient larger than the bucket stays in its own tensor
  (``extra_large_param_to_reduce``) until the next reduction. A fused expert stack of transformers 5
  (``gate_up_proj``, ``down_proj``: reduce_buckets.layer_tensors) is such a gradient, made whole by
  ``torch._grouped_mm``'s backward;
- after a reduction, ``copy_grads_in_partition`` copies each reduced gradient of this rank's partition
  into ``grads_in_partition``, allocated whole (every parameter overlapping the partition:
  zero12_reductions.zero12_rank0_params) at the first such copy of the backward, the reduced gradient
  still in its own tensor;
- an accumulating micro-batch's epilogue keeps its partition's gradients in ``all_grad_tensors``
  (``get_all_grad_tensors``: views of that ``grads_in_partition``) while ``_release_ipg_buffers`` drops the
  buffer's own reference; the next micro-batch makes a new ``grads_in_partition`` and only its epilogue
  adds it into the old one and drops ``all_grad_tensors`` (``_use_compact_grad_partition_buffer`` is off
  when ``grad_accum_dtype`` is the model's dtype, the engine's default: engine.get_data_types).

With :math:`P` the partition's bytes, :math:`P_\\text{old}` the kept one (:math:`P` with accumulation,
else 0), :math:`B` the bucket and :math:`g` the gradients in their own tensors at a moment (the pending
oversized one and the arriving one), the largest moment of the layers' backward is

.. math::  G = P_\\text{old} + B + \\max_\\text{moments}(g \\cdot b + [\\text{made}] P)

over each gradient's arrival and the reduction that makes the partition. Each moment is counted beside what
is saved then (wrapper_rows.zero2_reduction_rows): the layers above released, and, where the gradient's hook
fires once its layer's MLP block is back-propagated (:func:`past_mlp`), the block's saved tensors too; only
a moment larger than every earlier one can be the peak (the activations only shrink down the backward).
"""

from __future__ import annotations

from functools import lru_cache
from itertools import accumulate
from typing import TYPE_CHECKING, NamedTuple

from tuneplan.estimator.wrappers.base import Epilogue
from tuneplan.estimator.wrappers.reduce_buckets import layer_tensors
from tuneplan.estimator.wrappers.zero12_reductions import (
    bucket_copy_elements,
    layers_trained,
    zero2_epilogue,
)
from tuneplan.estimator.xp import ceil_div

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run
    from tuneplan.specs.model import LayerSpec, ModelSpec


def trained_tensors(run: Run) -> tuple[list[int], list[int]]:
    """(the trained tensors' elements in module order, the order their hooks fire as indices into it) for
    a full or freeze fine-tune: the token embedding first, each layer's tensors, the final norm, the untied
    head; the backward from the head down, each layer's tensors last-to-first and its norms after them (the
    token embedding, whose gradient comes last, left out); a freeze run trains the top layers only."""
    sizes, backward, _ = trained_tensor_layers(run)
    return sizes, backward


def trained_tensor_layers(run: Run) -> tuple[list[int], list[int], list[tuple[int, int, int]]]:
    """:func:`trained_tensors` and each trained layer's (first index, end index, index of its first MLP
    tensor) into the sizes, bottom layer first."""
    setup = run.setup
    hf = run.profile.model_code == "hf"
    return tensor_layers(run.model, hf, setup.method, setup.freeze_trainable_layers)


def tensor_layers(model: ModelSpec, hf: bool, method: str,
                  freeze_layers: int) -> tuple[list[int], list[int], list[tuple[int, int, int]]]:
    """:func:`trained_tensor_layers` from the frozen values it reads."""
    specs = layers_trained(model, method, freeze_layers)
    kinds = {id(spec): (layer_tensors(spec, hf), attention_tensors(spec, hf))  # once per kind of layer
             for spec in {id(spec): spec for spec in specs}.values()}
    layers = [kinds[id(spec)][0] for spec in specs]
    full = method == "full"
    sizes = [model.embed_params] if full else []
    starts = []
    for layer in layers:
        starts.append(len(sizes))
        sizes += layer
    ends = [*starts[1:], len(sizes)]
    backward = []
    if full:
        sizes += [model.final_norm_params, model.lm_head_params]
        backward = [len(sizes) - 1, len(sizes) - 2]
    for start, end in zip(reversed(starts), reversed(ends), strict=True):
        backward += [*range(end - 2, start - 1, -1), end - 1]  # its tensors last-to-first, then the norms
    spans = [(start, end, start + kinds[id(spec)][1])
             for spec, start, end in zip(specs, starts, ends, strict=True)]
    return sizes, [i for i in backward if sizes[i]], spans


def attention_tensors(spec: LayerSpec, transformers_code: bool) -> int:
    """How many of a layer's tensors (reduce_buckets.layer_tensors) come before its MLP block's: the
    attention projections, which the layer's module order lists first."""
    count = 0
    for m in spec.linears:
        if m.role != "attn":
            break
        count += 1 if transformers_code else m.count
    return count


def past_mlp(i: int, spans: list[tuple[int, int, int]]) -> bool:
    """Whether tensor ``i``'s hook fires once its layer's MLP block has been back-propagated (autograd's
    engine releases a node's saved tensors as it returns, and a layer's hooks fire last-to-first in module
    order, its norms after them): the MLP's first tensor, an attention projection or the norms."""
    return any(start <= i < end and (i <= first_mlp or i == end - 1) for start, end, first_mlp in spans)


def past_mlp_scratch_per_token(run: Run) -> int:
    """Bytes a token of a layer's scratch once its MLP block is back-propagated (:func:`past_mlp`): the
    block's intermediate gradients are gone; live are the layer output's incoming gradient, which autograd's
    input buffer holds for the residual sum at the layer's input, and the gradient of the MLP's input from
    each linear reading it (gate and up: two, summed by the engine's input buffer once both exist), as at
    ZeRO-3's first reduction past the MLP (zero3_flush.zero3_flush_mlp_done_scratch)::

        T = h (b_res + n_in b_out)"""
    spec = max((spec for spec, _ in run.model.layer_groups), key=lambda s: sum(m.params for m in s.linears))
    readers = sum(m.count for m in spec.linears if m.role == "mlp" and m.reads == "mlp_in")
    return run.model.hidden * (run.dtypes.residual + readers * run.dtypes.linear_out)


class LayersBackward(NamedTuple):
    """:func:`layers_backward_moment`'s figures."""

    moment: int  # max(g b + [made] P) over every gradient's arrival
    made: bool  # whether the partition is made before the epilogue
    at_head: int  # that maximum over the head's gradients only, before any layer is back-propagated
    # the layers' moments that pass every earlier one, in hook order: (g b + [made] P, the trained layers
    # above the gradient's, whether its hook fires past its layer's MLP block: past_mlp)
    records: tuple[tuple[int, int, bool], ...]
    made_at_bottom: bool  # whether P is made by a reduction in the bottom layer, past its MLP block


def layers_backward_moment(run: Run, reduce_bucket: int, partition_bytes: int) -> LayersBackward:
    """(:math:`\\max(g \\cdot b + [\\text{made}] P)` of the module docstring in bytes, whether the
    partition is made before the epilogue, that maximum over the head's gradients only, reached before any
    layer is back-propagated, the layers' moments that pass every earlier one (a later moment has released
    more activations: only a larger one can be the peak), whether the reduction making the partition comes
    past the bottom layer's MLP block): walk the gradients in the order their hooks fire through the
    bucket. A reduction adds its flat copy (zero12_reductions.bucket_copy_elements: the bucket's slices per
    rank) beside the gradient that set it off; ``copy_grads_in_partition`` runs after that copy is freed. A
    LoRA run: (0, whether its adapters overflow one bucket; each is small beside it, 0, (), False)."""
    setup, trainable = run.setup, run.param_plan.trainable_params
    if setup.method not in ("full", "freeze"):
        return LayersBackward(0, trainable > reduce_bucket, 0, (), False)
    hf = run.profile.model_code == "hf"
    return gradient_walk(run.model, hf, setup.method, setup.freeze_trainable_layers,
                         ceil_div(trainable, setup.world_size), run.dtypes.compute, reduce_bucket,
                         partition_bytes)


@lru_cache(maxsize=256)
def gradient_walk(model: ModelSpec, hf: bool, method: str, freeze_layers: int, partition: int, compute: int,
                  reduce_bucket: int, partition_bytes: int) -> LayersBackward:
    """:func:`layers_backward_moment` of a full or freeze run, from the frozen values it reads (none of them
    the batch or the sequence: kept per model and sharding, every new batch shape reuses the walk)."""
    sizes, backward, spans = tensor_layers(model, hf, method, freeze_layers)
    start, mine = 0, set()
    offsets = list(accumulate(sizes, initial=0))[:-1]  # sum(sizes[:i]) of each tensor i
    for i, n in enumerate(sizes):  # this rank's (rank 0's): the tensors overlapping the flat group's start
        if start >= partition:
            break
        mine.add(i)
        start += n
    head = {len(sizes) - 1, len(sizes) - 2} if method == "full" else set()
    # a freeze run's lowest trained layer is not the model's bottom layer, whose row comes after it
    bottom = spans[:1] if method == "full" else []
    members: list[int] = []
    records: list[tuple[int, int, bool]] = []
    pending = elements = moment = at_head = 0
    made = at_bottom = False
    for i in backward:
        n = sizes[i]
        arrival = (pending + n) * compute + (partition_bytes if made else 0)
        if members and elements + n > reduce_bucket:
            copy = bucket_copy_elements([(offsets[m], sizes[m]) for m in members], partition, reduce_bucket)
            arrival += copy * compute
            if not made and mine.intersection(members):
                made, at_bottom = True, past_mlp(i, bottom)
                arrival = max(arrival, (pending + n) * compute + partition_bytes)
            members, pending, elements = [], 0, 0
        moment = max(moment, arrival)
        if i in head:
            at_head = max(at_head, arrival)
        elif not records or arrival > records[-1][0]:
            above = sum(1 for start, _, _ in spans if start > i)
            records.append((arrival, above, past_mlp(i, spans)))
        members.append(i)
        elements += n
        pending = n if n > reduce_bucket else 0
    return LayersBackward(moment, made, at_head, tuple(records), at_bottom)


def zero2_backward(run: Run, reduce_bucket: int, buffers: int,
                   partition_bytes: int) -> tuple[Epilogue | None, int, int, bool, int,
                                                  tuple[tuple[int, int, bool], ...], int]:
    """(ZeRO-2's epilogue, :math:`G` (the bytes of gradients and buffers at the largest moment of its
    layers' backward; 0 where it is not modelled), :math:`P_\\text{old}`, whether a reduction of the
    layers' backward makes :math:`P`, :math:`G` at the head's gradients alone, before any layer's
    backward, 0 where not modelled, the layers' record moments (:class:`LayersBackward` ``records``, as
    :math:`G`), :math:`P` where the bottom layer's reduction past its MLP block makes it and nothing kept
    precedes it (the bottom layer's row, its activations or recomputation whole, lacks it), else 0):
    the epilogue and :math:`G` with the partition an accumulation keeps
    (a later micro-batch's: none where the run's first micro-batch is its longest, the peak's), the
    epilogue's reductions running before it is dropped (``independent_gradient_partition_epilogue``). The
    layers' rows count one partition (the kept one, or :math:`P` once made). With offload the partitions
    go to the host: none made; the layers' reductions and their flat copies are there all the same
    (``reduce_ipg_grads`` -> ``average_tensor`` before ``copy_grads_in_partition`` sends this rank's
    slices to the host), beside ZeRO-Offload's ``temp_grad_buffer_for_gpu_offload`` in ``buffers``."""
    setup = run.setup
    kept = partition_bytes if setup.grad_accum > 1 and not setup.longest_batch_first else 0
    epilogue = zero2_epilogue(run, reduce_bucket, buffers + kept, partition_bytes)
    # with offload the partition goes to the host (``partition_bytes`` is 0: none made on the device), but
    # the reductions in the layers' backward and their flat copies are the same
    walk = layers_backward_moment(run, reduce_bucket, partition_bytes)
    made = walk.made and setup.offload == "none"
    records = tuple((kept + buffers + g, above, past) for g, above, past in walk.records)
    return (epilogue, kept + buffers + walk.moment if walk.moment else 0, kept, made,
            kept + buffers + walk.at_head if walk.at_head else 0, records,
            partition_bytes if made and walk.made_at_bottom and not kept else 0)
