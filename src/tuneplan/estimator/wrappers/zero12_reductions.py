"""DeepSpeed ZeRO-1/2's gradient reductions and step, read from ``DeepSpeedZeroOptimizer``
(runtime/zero/stage_1_and_2.py, DeepSpeed 0.19.8): what rank 0's gradient partition holds, the reductions'
copies at the end of the backward, the larger instant of the step, the token embedding's backward."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.base import Epilogue
from tuneplan.estimator.wrappers.reduce_buckets import (
    bucket_fills,
    bucket_members,
    full_backward_gradients,
    layer_gradients_from_top,
    layer_tensors,
)
from tuneplan.estimator.xp import ceil_div
from tuneplan.specs.model import LayerSpec, ModelSpec
from tuneplan.specs.setup import TrainSetup

NORM_BYTES = 8  # fp64, DeepSpeed's get_norm_dtype() on CUDA (runtime/zero/utils.py)

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run
    from tuneplan.estimator.wrappers.zero_terms import DeepSpeedTerms


def zero12_step(run: Run, terms: DeepSpeedTerms) -> tuple[int, int]:
    """(16-bit gradient bytes, temporaries) at the larger instant of ZeRO-1/2's step without offload.

    stage_1_and_2.py ``step`` (DeepSpeed 0.19.8): after freeing the gradients of the parameters outside
    this rank's slice, ``flatten(averaged_gradients)`` copies the slice's gradients into one 16-bit tensor
    and ``.to(fp32)`` makes the fp32 gradient partition (in fp32 the copy is that partition), the gradients
    of the parameters overlapping the slice still held (``zero12_rank0_params``); they and the 16-bit copy
    are freed (``free_grad_in_param_list``, ``averaged_gradients = None``) before the optimizer steps, which
    sees the fp32 gradient partition and its own temporaries."""
    compute = run.dtypes.compute
    partition = ceil_div(run.param_plan.trainable_params, run.setup.world_size)
    held = zero12_rank0_params(run, partition) * compute
    flat = partition * compute if compute < 4 else 0
    norm_held, norm_copy = zero2_norm_moment(run, partition)
    if norm_held + norm_copy > max(held + flat + terms.fp32_grad_step, terms.step_temp):
        return norm_held, norm_copy
    if held + flat + terms.fp32_grad_step > terms.step_temp:
        return held, flat + terms.fp32_grad_step
    return 0, terms.step_temp


def zero2_norm_moment(run: Run, partition: int) -> tuple[int, int]:
    """(16-bit gradient bytes, the norm's copy) as ZeRO-2's step takes the gradients' norm, before it
    flattens them (stage_1_and_2.py ``step`` -> ``scaled_global_norm`` -> ``get_grad_norm_direct``):
    ``averaged_gradients`` holds one view per parameter overlapping rank 0's slice (``get_flat_partition``)
    of ``grads_in_partition``, allocated whole (every overlapping parameter counted whole: zero2_partition),
    and each view is copied to ``get_norm_dtype()`` (fp64) for its norm, one at a time::

        (sum_{p overlapping} n_p b, 8 max_p |p cap slice|)

    (0, 0) for ZeRO-1 or where the module order is not known."""
    order = (run_module_order(run)
             if run.setup.method == "full" else freeze_module_order(run))
    if run.setup.zero != 2 or not order:
        return 0, 0
    covered = largest = 0
    for numel in order:
        if covered >= partition:
            break
        largest = max(largest, min(numel, partition - covered))
        covered += numel
    return covered * run.dtypes.compute, NORM_BYTES * largest


def zero12_rank0_params(run: Run, partition: int) -> int:
    """Elements of the parameters overlapping rank 0's 1/N slice of the flat group (the rank simulated and
    estimated), each counted whole: ZeRO-2's ``grads_in_partition`` (stage_1_and_2.py
    ``copy_grads_in_partition`` sums ``numel()`` over ``params_in_partition``, DeepSpeed 0.19.8) and the
    gradients both stages hold into the step. In a full fine-tune the flat group
    follows the module order, the token embedding first, so one large embedding can hold more than the
    slice; in a freeze run it holds the trained layers' tensors in module order (:func:`trained_layers`),
    where a fused expert stack the slice ends in is held whole; LoRA: the slice (its adapters are small)."""
    hf = run.profile.model_code == "hf"
    if run.setup.method == "full":
        order = run_module_order(run)
    elif run.setup.method == "freeze":
        order = [n for spec in trained_layers(run.model, run.setup) for n in layer_tensors(spec, hf)]
    else:
        return partition
    covered = 0
    for numel in order:
        if covered >= partition:
            break
        covered += numel
    return max(covered, partition)


def run_module_order(run: Run) -> list[int]:
    """:func:`full_module_order` of the run's model under its profile's model code, made once per run and
    kept in ``run.memo`` (it reads neither the batch nor the sequence nor ``grad_accum``: a reshaped run
    shares it); a fresh list each call."""
    order = run.memo.get("module_order")
    if order is None:
        order = run.memo["module_order"] = tuple(full_module_order(run.model, run.profile.model_code == "hf"))
    return list(order)


def full_module_order(model: ModelSpec, transformers_code: bool = True) -> list[int]:
    """A full fine-tune's parameters (elements) in module order, the order of the flat 16-bit group: the
    token embedding, each layer's linears and norms, the final norm, the untied head. Under transformers'
    model code (``transformers_code``) the layers come in the order they are built
    (:func:`layers_in_module_order`) and a MoE layer's routed experts are two tensors, not one per expert:
    transformers 5 builds them as fused 3-D parameters (``*Experts``: ``gate_up_proj`` of E x 2f x h and
    ``down_proj`` of E x h x f, e.g. modeling_deepseek_v3.py), so a slice boundary inside them holds the
    whole stack; other model code: the spec's layer groups, one tensor per expert projection."""
    if not transformers_code:
        order = [model.embed_params]
        for spec, count in model.layer_groups:
            layer = [m.params // m.count for m in spec.linears for _ in range(m.count)]
            order += [*layer, spec.norm_params] * count
        return [n for n in [*order, model.final_norm_params, model.lm_head_params] if n]
    order = [model.embed_params]
    tensors: dict[int, list[int]] = {}  # each kind of layer's tensors, once (the layers share their spec)
    for spec in layers_in_module_order(model):
        # the fused expert stacks after the router (Mixtral, Qwen2-MoE build it first; DeepSeek and
        # Qwen3-MoE after the experts: h x E elements)
        if id(spec) not in tensors:
            tensors[id(spec)] = layer_tensors(spec)
        order += tensors[id(spec)]
    return [n for n in [*order, model.final_norm_params, model.lm_head_params] if n]


def layers_in_module_order(model: ModelSpec) -> list[LayerSpec]:
    """The decoder layers in the order transformers builds them, where a model mixes dense and MoE layers
    (its ModelSpec groups them by kind): DeepSeek-V2/V3 from the config's ``first_k_dense_replace`` and
    ``moe_layer_freq`` (``DeepseekV2DecoderLayer``: a MoE block where ``layer_idx >=
    first_k_dense_replace``), Qwen-MoE from ``mlp_only_layers`` and ``decoder_sparse_step``
    (``Qwen3MoeDecoderLayer``); the groups' order where the counts do not match."""
    groups = model.layer_groups
    flat = [spec for spec, count in groups for _ in range(count)]
    kinds = {spec.moe: spec for spec, _ in groups}
    if len(groups) != 2 or len(kinds) != 2:
        return flat
    cfg, n = model.config, len(flat)
    if "first_k_dense_replace" in cfg:
        first, freq = int(cfg.get("first_k_dense_replace") or 0), int(cfg.get("moe_layer_freq") or 1)
        moe = [i >= first and i % freq == 0 for i in range(n)]
    else:
        dense_only = set(cfg.get("mlp_only_layers") or [])
        step = int(cfg.get("decoder_sparse_step") or 1)
        moe = [i not in dense_only and (i + 1) % step == 0 for i in range(n)]
    if sum(moe) != sum(count for spec, count in groups if spec.moe):
        return flat
    return [kinds[m] for m in moe]



def trained_layers(model: ModelSpec, setup: TrainSetup) -> list[LayerSpec]:
    """The decoder layers a full or freeze fine-tune trains, in module order (:func:`layers_in_module_order`):
    every one, or a freeze run's top ``freeze_trainable_layers``."""
    return layers_trained(model, setup.method, setup.freeze_trainable_layers)


def layers_trained(model: ModelSpec, method: str, freeze_trainable_layers: int) -> list[LayerSpec]:
    """:func:`trained_layers` from the setup's two fields it reads."""
    layers = layers_in_module_order(model)
    if method == "freeze":
        layers = layers[max(len(layers) - freeze_trainable_layers, 0):]
    return layers

def offload_norm_copy(run: Run, largest: int) -> int:
    """ZeRO-Offload's temporary as a reduced gradient leaves for the host: ``copy_grads_in_partition`` ->
    ``set_norm_for_param_grad_in_gpu`` takes the norm of the gradient's slice in this rank's partition in
    ``get_norm_dtype()`` (runtime/zero/utils.py: fp64 where the device has it), a copy freed before
    ``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` makes its fp32 one (DeepSpeed 0.19.8): 8 bytes per
    element of the largest slice, ``largest`` elements at most; 0 without offload."""
    if run.setup.offload == "none":
        return 0
    return NORM_BYTES * min(largest, ceil_div(run.param_plan.trainable_params, run.setup.world_size))


def freeze_module_order(run: Run) -> list[int]:
    """A freeze run's trainable parameters (elements) in module order, the order of its flat 16-bit group:
    the top ``freeze_trainable_layers`` decoder layers as transformers builds them
    (:func:`layers_in_module_order`), each layer's tensors by :func:`reduce_buckets.layer_tensors` (a MoE
    layer's fused ``gate_up_proj`` / ``down_proj`` stacks as one tensor each); [] for another method or
    where these do not add up to the trainable parameters (LLaMA-Factory's freeze modules beyond the
    layers)."""
    setup = run.setup
    if setup.method != "freeze":
        return []
    layers = layers_in_module_order(run.model)[-setup.freeze_trainable_layers:]
    hf = run.profile.model_code == "hf"
    order = [n for spec in layers for n in layer_tensors(spec, transformers_code=hf) if n]
    return order if sum(order) == run.param_plan.trainable_params else []


def largest_trained_param(run: Run) -> int:
    """Elements of the largest parameter of the flat 16-bit group (stage_1_and_2.py ``__init__``:
    ``largest_param_numel``, the size of ZeRO-Offload's ``temp_grad_buffer_for_gpu_offload``): the largest
    entry of the module order where it is known (a MoE's fused ``gate_up_proj`` is one parameter of
    E x 2f x h elements under transformers' code), else the plan's largest trainable tensor."""
    order = (run_module_order(run)
             if run.setup.method == "full" else freeze_module_order(run))
    return max(order) if order else run.param_plan.largest_trainable_tensor


def zero1_epilogue(run: Run, reduce_bucket: int, buffers: int, grads16: int) -> Epilogue | None:
    """ZeRO-1 at the accumulation boundary, without offload: ``reduce_gradients`` walks the flat group's
    parameters in module order (DeepSpeed 0.19.8 stage_1_and_2.py), each gradient copied into the bucket
    and its own storage released (``reduce_independent_p_g_buckets_and_remove_grads``: ``grad.data`` becomes
    the bucket's view; one larger than the bucket stays where it is, reduced alone), until the first
    ``reduce_ipg_grads``, whose ``copy_grads_in_partition`` allocates ``grads_in_partition``: every
    parameter overlapping this rank's slice, whole, in the module dtype (zero12_rank0_params), while every
    other gradient is still held::

        gradients = G - first bucket's members (when they fit it) + bucket + rank-0 parameters

    (simulate: Qwen2.5-7B at 2 layers, fp32, 2 GPUs: the embedding reduced alone, 790,900,224 elements
    allocated beside every gradient). None where the order is not known (a partial fine-tune wider than
    the bucket); with offload: zero1_offload.zero1_offload_epilogue."""
    params, compute = run.param_plan, run.dtypes.compute
    order = (run_module_order(run)
             if run.setup.method == "full"
             else [params.trainable_params] if params.trainable_params <= reduce_bucket else [])
    members = bucket_members(order, reduce_bucket)
    if not members:
        return None
    moved = sum(members[0]) if sum(members[0]) <= reduce_bucket else 0
    rank0 = zero12_rank0_params(run, ceil_div(params.trainable_params, run.setup.world_size))
    return Epilogue(gradients=max(grads16 - moved * compute, 0) + buffers + rank0 * compute, reduction_copy=0)


def flat_copy_elements(start: int, elements: int, partition: int, reduce_bucket: int) -> int:
    """Elements of the largest 16-bit copy a ZeRO-2 reduction of the flat group's range ``[start, start +
    elements)`` makes, 0 where it makes none: :func:`bucket_copy_elements` of that one range. A range
    inside one partition is never copied; the lm_head of Meta-Llama-3-8B over 8 GPUs, 525,336,576 elements
    across three ranks' partitions of 240,390,656, is copied whole (simulate: ``cat``)."""
    return bucket_copy_elements([(start, elements)], partition, reduce_bucket)


def bucket_copy_elements(ranges: list[tuple[int, int]], partition: int, reduce_bucket: int) -> int:
    """Elements of the largest 16-bit copy a ZeRO-2 reduction of the IPG bucket makes, 0 where it makes
    none; ``ranges``: each gradient in the bucket as (start in the flat group, elements), in the order the
    hooks copied them into the bucket.

    DeepSpeed 0.19.8, stage_1_and_2.py ``average_tensor``: walking the bucket's parameters in that order,
    each one is cut into a slice per rank whose partition (``partition`` elements, the flat group's 1/N) it
    overlaps, and a slice merged with the one before it when both go to the same rank (they are adjacent in
    the bucket, whatever their places in the flat group); ``allreduce_and_scatter`` gathers the slices into
    groups, each closed once its elements pass ``reduce_bucket_size``, and ``allreduce_bucket`` flattens
    each group (``self.flatten``: torch's ``flatten_dense_tensors`` is a view of a lone slice, ``cat`` of
    several). So a layer's norms, back-propagated after its linears but placed after them in the flat group
    too, are a slice of their own in the bucket, not a gap that widens the copy (simulate: Phi-3-medium full
    at 3 layers over 4 GPUs, bf16: the bucket of layer 2's qkv_proj down to layer 0's down_proj, 471.9 M
    elements over three ranks' partitions, copied as its 471.9 M elements)."""
    slices: list[int] = []
    last_rank = -1
    for start, elements in ranges:
        first = start
        while first < start + elements:
            rank = first // partition
            end = min((rank + 1) * partition, start + elements)
            if rank == last_rank:
                slices[-1] += end - first
            else:
                slices.append(end - first)
            last_rank, first = rank, end
    largest = group = count = 0
    for piece in slices:
        group, count = group + piece, count + 1
        if group > reduce_bucket:
            largest = max(largest, group if count > 1 else 0)
            group = count = 0
    return max(largest, group if count > 1 else 0)


def zero2_epilogue(run: Run, reduce_bucket: int, buffers: int, partition: int) -> Epilogue | None:
    """ZeRO-2's last gradient reductions, with every activation released (None where the order in which the
    trainable gradients reach the bucket is not known: a partial fine-tune wider than the bucket): the larger
    of the epilogue's and of the one the last gradient (the token embedding's) sets off on arriving.

    DeepSpeed 0.19.8, stage_1_and_2.py: a reduction (``reduce_ipg_grads`` -> ``average_tensor`` ->
    ``allreduce_and_scatter`` -> ``allreduce_bucket``) copies every gradient slice it reduces into a new
    16-bit tensor (``self.flatten(bucket)``, use_multi_rank_bucket_allreduce, the default) while the bucket
    is still held. A gradient that would take the bucket past ``reduce_bucket_size`` first reduces what the
    bucket holds, its own gradient live beside it; one larger than the bucket stays in its own tensor
    (``extra_large_param_to_reduce``) until the next reduction, the epilogue's
    (``independent_gradient_partition_epilogue``). ``grads_in_partition`` (``copy_grads_in_partition``)
    exists at a reduction only if an earlier one of this backward made it: an accumulating micro-batch's
    partition is released as its gradients move into the bucket."""
    compute, setup = run.dtypes.compute, run.setup
    gradients = (full_backward_gradients(run.model) if setup.method == "full"
                 else layer_gradients_from_top(run.model, setup.freeze_trainable_layers)
                 if setup.method == "freeze"
                 else [run.param_plan.trainable_params] if run.param_plan.trainable_params <= reduce_bucket
                 else [])
    fills = bucket_fills(gradients, reduce_bucket)
    if not fills:
        return None
    on_flush = None
    if setup.method == "freeze" and len(fills) > 1:
        # a freeze run's first reduction, in its trained layers' backward: set off by the gradient that would
        # overflow the bucket, live beside it and the reduction's flat copy; no partition exists yet. Below
        # the lowest trained layer nothing was saved, and that layer's own activations are small beside the
        # bucket (simulate: Phi-3-medium freeze over 4 GPUs peaks at this copy, ``cat``)
        arriving = bucket_members(gradients, reduce_bucket)[1][0]
        on_flush = Epilogue(gradients=buffers + arriving * compute, reduction_copy=fills[0] * compute)
    last = fills[-1]
    outside = last if last > reduce_bucket else 0
    # the last reduction holds the token embedding's gradient, first in the flat group: in rank 0's slice
    params = run.param_plan
    largest = run.model.embed_params if run.setup.method == "full" else params.largest_trainable_tensor
    # an oversized tensor reduced alone, the flat group's first (rank 0's slice at offset 0), is copied only
    # where it overlaps several ranks' partitions (flat_copy_elements)
    copied = (flat_copy_elements(0, last, ceil_div(run.param_plan.trainable_params, setup.world_size),
                                 reduce_bucket) if outside else last) * compute
    # this backward's ``grads_in_partition`` is made by the first reduction holding a parameter of rank 0's
    # slice, the flat group's first 1/N (module order, a freeze run's trained layers' alike:
    # zero12_rank0_params; the backward reduces from its end): held_by(n), a
    # reduction among the first n of this backward (``copy_grads_in_partition`` only for
    # ``is_param_in_current_partition``; the others' gradients are released)
    slice_start = sum(gradients) - ceil_div(run.param_plan.trainable_params, setup.world_size)

    def held_by(n: int) -> bool:  # a full or freeze run's flat order is known; otherwise any earlier one
        return n > 0 and (setup.method not in ("full", "freeze") or sum(fills[:n]) > slice_start)

    end = Epilogue(gradients=buffers + (partition if held_by(len(fills) - 1) else 0) + outside * compute,
                   reduction_copy=max(copied, offload_norm_copy(run, largest)))
    if len(fills) > 1 and last == gradients[-1]:  # the last gradient set off the reduction before it
        made = partition if held_by(len(fills) - 2) else 0
        on_arrival = Epilogue(gradients=buffers + made + last * compute,
                              reduction_copy=fills[-2] * compute)
        end = max(end, on_arrival, key=lambda e: e.gradients + e.reduction_copy)
    return end if on_flush is None else max(end, on_flush, key=lambda e: e.gradients + e.reduction_copy)


def zero12_grads_at_embedding(model: ModelSpec, setup: TrainSetup, trainable_params: int, grads16: int,
                              g_live: int, bucket_bytes: int, partition_made: bool) -> int:
    """Gradient bytes alive under ZeRO-1/2 while the token embedding is back-propagated (a full fine-tune;
    the embedding is the last parameter whose gradient autograd makes), the embedding's own gradient and
    the backward kernel's temporaries excluded (memory.embedding_backward_row adds those); -1 when the
    instant is not modelled (LoRA: a frozen embedding).

    DeepSpeed 0.19.8, ``runtime/zero/stage_1_and_2.py``:
    - ``process_gradients`` runs ``setup_buckets`` on the first ready gradient: the contiguous-gradients
      bucket is allocated whole and stays until ``_release_ipg_buffers`` at the end of the backward;
    - ZeRO-1 (``partition_gradients`` False, no ``overlap_comm``): the hook does not call
      ``reduce_ready_partitions_and_remove_grads``; every 16-bit gradient stays in ``param.grad`` until the
      epilogue;
    - ZeRO-2: each gradient is copied into the bucket (``reduce_independent_p_g_buckets_and_remove_grads``);
      only when the next one would overflow ``reduce_bucket_size`` does ``reduce_ipg_grads`` run, and its
      ``copy_grads_in_partition`` allocates ``grads_in_partition`` (this rank's 1/N partition, 16 bits),
      called only for a reduced parameter of this rank's partition (``is_param_in_current_partition``).
      While the embedding's gradient is being made its hook has not fired: the partition exists only if
      a reduction before it held a parameter of this rank's partition (``partition_made``:
      zero2_partition.layers_backward_moment). Rank 0's partition starts at the flat group's start, the
      token embedding: where the embedding covers all of it (a tied head's, a large vocabulary's), no
      earlier reduction makes it, however many buckets the layers fill."""
    if setup.method != "full":
        return -1
    embed_params = model.embed_params
    if setup.zero == 1:
        if setup.grad_accum > 1:
            # a later micro-batch: every gradient, the embedding's among them, is there from the earlier
            # ones (nothing reduces before the boundary's reduce_gradients), beside the bucket setup_buckets
            # made in the first one (kept while ready_for_gradients); the new embedding gradient is a
            # temporary AccumulateGrad adds in place (zero.py: the layers then hold it, no cut)
            return grads16 + bucket_bytes
        return max(grads16 - embed_params * (grads16 // max(trainable_params, 1)), 0) + bucket_bytes
    return (g_live if partition_made else 0) + bucket_bytes
