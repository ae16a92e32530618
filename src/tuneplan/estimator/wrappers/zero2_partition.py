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

over each gradient's arrival and the reduction that makes the partition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.base import Epilogue
from tuneplan.estimator.wrappers.reduce_buckets import layer_tensors
from tuneplan.estimator.wrappers.zero12_reductions import (
    bucket_copy_elements,
    trained_layers,
    zero2_epilogue,
)
from tuneplan.estimator.xp import ceil_div

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def trained_tensors(run: Run) -> tuple[list[int], list[int]]:
    """(the trained tensors' elements in module order, the order their hooks fire as indices into it) for
    a full or freeze fine-tune: the token embedding first, each layer's tensors, the final norm, the untied
    head; the backward from the head down, each layer's tensors last-to-first and its norms after them (the
    token embedding, whose gradient comes last, left out); a freeze run trains the top layers only."""
    model, setup = run.model, run.setup
    layers = [layer_tensors(spec, run.profile.model_code == "hf") for spec in trained_layers(model, setup)]
    full = setup.method == "full"
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
    return sizes, [i for i in backward if sizes[i]]


def layers_backward_moment(run: Run, reduce_bucket: int, partition_bytes: int) -> tuple[int, bool, int]:
    """(:math:`\\max(g \\cdot b + [\\text{made}] P)` of the module docstring in bytes, whether the partition
    is made before the epilogue, that maximum over the head's gradients only, reached before any layer is
    back-propagated): walk the gradients in the order their hooks fire through the bucket. A reduction
    adds its flat copy (zero12_reductions.bucket_copy_elements: the bucket's slices per rank) beside
    the gradient that set it off; ``copy_grads_in_partition`` runs after that copy is freed. A LoRA run:
    (0, whether its adapters overflow one bucket; each is small beside it, 0)."""
    if run.setup.method not in ("full", "freeze"):
        return 0, run.param_plan.trainable_params > reduce_bucket, 0
    sizes, backward = trained_tensors(run)
    partition, start, mine = ceil_div(run.param_plan.trainable_params, run.setup.world_size), 0, set()
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    for i, n in enumerate(sizes):  # this rank's (rank 0's): the tensors overlapping the flat group's start
        if start >= partition:
            break
        mine.add(i)
        start += n
    head = {len(sizes) - 1, len(sizes) - 2} if run.setup.method == "full" else set()
    members: list[int] = []
    pending = elements = moment = at_head = 0
    made = False
    for i in backward:
        n, compute = sizes[i], run.dtypes.compute
        arrival = (pending + n) * compute + (partition_bytes if made else 0)
        if members and elements + n > reduce_bucket:
            copy = bucket_copy_elements([(offsets[m], sizes[m]) for m in members], partition, reduce_bucket)
            arrival += copy * compute
            if not made and mine.intersection(members):
                made = True
                arrival = max(arrival, (pending + n) * compute + partition_bytes)
            members, pending, elements = [], 0, 0
        moment = max(moment, arrival)
        at_head = max(at_head, arrival) if i in head else at_head
        members.append(i)
        elements += n
        pending = n if n > reduce_bucket else 0
    return moment, made, at_head


def zero2_backward(run: Run, reduce_bucket: int, buffers: int,
                   partition_bytes: int) -> tuple[Epilogue | None, int, int, bool, int]:
    """(ZeRO-2's epilogue, :math:`G` (the bytes of gradients and buffers at the largest moment of its
    layers' backward; 0 where it is not modelled), :math:`P_\\text{old}`, whether a reduction of the
    layers' backward makes :math:`P`, :math:`G` at the head's gradients alone, before any layer's
    backward, 0 where not modelled): the epilogue and :math:`G` with the partition an accumulation keeps
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
    moment, made, at_head = layers_backward_moment(run, reduce_bucket, partition_bytes)
    return (epilogue, kept + buffers + moment if moment else 0, kept, made and setup.offload == "none",
            kept + buffers + at_head if at_head else 0)
