"""ZeRO-1 with ``offload_optimizer`` at the accumulation boundary: ``reduce_gradients``' walk over the flat
group, each of its reductions with what is still held beside it (DeepSpeed 0.19.8, stage_1_and_2.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.base import Epilogue
from tuneplan.estimator.wrappers.zero12_reductions import (
    NORM_BYTES,
    bucket_copy_elements,
    freeze_module_order,
    run_module_order,
)
from tuneplan.estimator.xp import ceil_div

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def zero1_offload_epilogue(run: Run, reduce_bucket: int, buffers: int, grads16: int) -> Epilogue | None:
    """The larger of ZeRO-1's reductions under ``offload_optimizer``, every activation released (None where
    the order is not known: a LoRA fine-tune wider than the bucket).

    ``reduce_gradients`` walks the flat group's parameters in module order (a freeze run: its trained
    layers', :func:`zero12_reductions.freeze_module_order`) through
    ``reduce_independent_p_g_buckets_and_remove_grads``: a gradient that fits the bucket is copied into it
    and its own storage released; one wider than the bucket stays in its own tensor
    (``extra_large_param_to_reduce``; with offload ``grad_reduc.data`` becomes a clone of it), reduced
    alone. A gradient that would take the bucket past ``reduce_bucket_size`` first sets off
    ``reduce_ipg_grads`` on what it holds (the last one at
    ``overlapping_partition_gradients_reduce_epilogue``):
    ``average_tensor`` copies the slices it reduces where they are several (:func:`bucket_copy_elements`),
    then ``copy_grads_in_partition``, for each reduced parameter overlapping rank 0's 1/N slice, takes the
    norm of that overlap in ``get_norm_dtype()`` (fp64, ``set_norm_for_param_grad_in_gpu``) and sends it to
    the host, releasing the gradient (``clear_grad_attribute``). So reduction k holds::

        gradients_k = G - b (sum of gradients moved into the bucket before it)
                        - b (sum of oversized rank-0 gradients reduced before it) + buffers
        copy_k      = max(b * bucket copy, 8 * max_p |p cap [0, P)|)

    with ``b`` the module's bytes per element, P the slice. A transformers 5 Mixtral's fused ``gate_up_proj``
    (E x 2f x h, wider than the bucket) is reduced alone in the second reduction, after the embedding and
    the attention, its fp64 copy beside every later layer's gradients (simulate: Mixtral-8x7B at 4 layers,
    bf16, 2 GPUs: 939,524,096 elements copied to fp64 beside layers 1-3's expert stacks)."""
    params, compute = run.param_plan, run.dtypes.compute
    known = run_module_order(run) \
        if run.setup.method == "full" else freeze_module_order(run)
    order = known or ([params.trainable_params] if params.trainable_params <= reduce_bucket else [])
    if not order:
        return None
    partition = ceil_div(params.trainable_params, run.setup.world_size)
    held, start = grads16, 0
    bucket: list[tuple[int, int]] = []  # (start in the flat group, elements)
    moments: list[Epilogue] = []
    for numel in [*order, 0]:  # the trailing 0: the epilogue's reduction of what the bucket still holds
        if bucket and (numel == 0 or sum(n for _, n in bucket) + numel > reduce_bucket):
            overlaps = [max(min(s + n, partition) - s, 0) for s, n in bucket]
            copy = bucket_copy_elements(bucket, partition, reduce_bucket) * compute
            moments.append(Epilogue(gradients=max(held, 0) + buffers,
                                    reduction_copy=max(copy, NORM_BYTES * max(overlaps))))
            if len(bucket) == 1 and bucket[0][1] > reduce_bucket and overlaps[0]:
                held -= bucket[0][1] * compute  # rank 0's oversized gradient has gone to the host
            bucket = []
        if numel == 0:
            break
        if numel > reduce_bucket:  # the clone made beside the gradient it replaces
            moments.append(Epilogue(gradients=max(held, 0) + buffers, reduction_copy=numel * compute))
        else:
            held -= numel * compute
        bucket.append((start, numel))
        start += numel
    return max(moments, key=lambda e: e.gradients + e.reduction_copy)
