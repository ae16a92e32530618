"""Data parallelism: what DDP, DeepSpeed ZeRO-1/2/3 and FSDP keep on each GPU.

- DDP (torch.nn.parallel.DistributedDataParallel, ``gradient_as_bucket_view=False`` default): full
  replica, plus flat gradient buckets the size of all trainable gradients, allocated at wrap time.
- DeepSpeed with bf16/fp16: module parameters in 16 bits, fp32 master partition (4/N B per trainable
  param) and fp32 Adam states (8/N) in its own optimizer (FusedAdam: no foreach workspace). Buffers
  from DeepSpeed's defaults (deepspeed/runtime/zero/config.py): ``reduce_bucket_size`` 5e8 elements
  (the contiguous-gradients bucket, allocated whole whatever the trainable count),
  stage-3 ``prefetch_bucket_size`` 5e7 elements (ZeRO paper arXiv 1910.02054 for the partitioning).
  ZeRO-1 keeps full 16-bit gradients; ZeRO-2 keeps a 16-bit gradient partition plus the reduce bucket;
  ZeRO-3 also partitions all parameters and gathers the current layer and the prefetch bucket.
- FSDP FULL_SHARD with a bf16 MixedPrecision policy: sharded parameters in their own dtype, the current
  and the prefetched unit unsharded in 16 bits (one layer when each adapter is its own unit:
  ``fsdp_layers_gathered``), the unsharded gradient of the unit being reduce-scattered
  (``fsdp_reduce_scatter_input``), sharded fp32 gradients, sharded optimizer states.
- Offload: optimizer states, fp32 master and fp32 gradients to CPU (DeepSpeed ZeRO-Offload), and with
  ``all`` the parameters too (ZeRO-Infinity / FSDP CPUOffload); reported as host memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

DS_REDUCE_BUCKET = 500_000_000  # elements, DeepSpeed default reduce_bucket_size
DS_PREFETCH_BUCKET = 50_000_000  # elements, DeepSpeed default stage3_prefetch_bucket_size
DS_MAX_REUSE_DISTANCE = 1_000_000_000  # elements, DeepSpeed default stage3_max_reuse_distance
DS_MAX_LIVE_PARAMETERS = 1_000_000_000  # elements, DeepSpeed default stage3_max_live_parameters
# modules of a decoder layer that hold no parameter but still run ZeRO-3's fetch hook (each one a prefetch
# opportunity): the layer, its attention, its MLP and the MLP's activation module
HOOKED_CONTAINERS_PER_LAYER = 4
NCCL_BYTES = 512 * 1024**2  # NCCL buffers + communicator state per process (order of NCCL_BUFFSIZE=4 MiB
#                             x channels x peers); outside PyTorch's allocator


@dataclass(frozen=True)
class ShardPlan:
    weights: int
    grads_live: int  # gradients that exist once backward has run (per GPU)
    grad_buffers: int  # persistent gradient buffers (DDP buckets, ZeRO reduce bucket)
    states: int
    optimizer_temp: int
    gathered: int  # ZeRO-3/FSDP unsharded parameters in flight
    host: int
    nccl: int
    notes: tuple[str, ...] = ()
    # gradient bytes alive only while a layer is back-propagated (FSDP's unsharded gradient of the unit being
    # reduce-scattered), unlike grad_buffers, which persist (DDP buckets, the ZeRO reduce bucket)
    transient_grad_buffers: int = 0
    # ZeRO-3/FSDP unsharded parameters at the loss and at the end of the forward (-1: as ``gathered``)
    gathered_outside_layers: int = -1

    # FSDP2: sharded gradients not made yet while the layers near the bottom are back-propagated, and the
    # end of the backward (the embedding's) as (gradient bytes beyond the sharded ones, unsharded parameters)
    grads_pending_bottom: int = 0
    end_of_backward: tuple[int, int] | None = None
    # unsharded parameters at the end of the forward, where the loss is computed (-1: as at the loss)
    gathered_forward_end: int = -1
    # FSDP: the top layer's backward, whose unsharded gradients are made as its activations are released, as
    # (those gradients as counted in transient_grad_buffers, the gradient bytes live at its end, unsharded
    # parameters then, whether its last op's scratch is live at its end); None: as the other layers
    top_layer: tuple[int, int, int, bool] | None = None
    # DeepSpeed ZeRO-1/2 (a full fine-tune): gradient bytes alive while the token embedding is
    # back-propagated, its own gradient excluded, buffers included (-1: the single-GPU rule or none), and
    # whether the layers' gradient rows already hold the embedding's gradient (ZeRO-1 keeps all of them)
    grads_at_embedding: int = -1
    layers_hold_embedding_grad: bool = False

    @property
    def gathered_at_forward_end(self) -> int:
        return self.gathered_at_loss if self.gathered_forward_end < 0 else self.gathered_forward_end

    @property
    def gathered_at_loss(self) -> int:
        return self.gathered if self.gathered_outside_layers < 0 else self.gathered_outside_layers


def shard(model: ModelSpec, setup: TrainSetup, *, weights: int, trainable_params: int, trainable_bytes: int,
          trainable_weight_params: int, states: int, optimizer_temp: int, compute_bytes: int,
          optimizer: str = "adamw", layer_stored_bytes: int = 0, root_embeddings: bool = True,
          largest_trainable: int = 0) -> ShardPlan:
    n = setup.world_size
    grads = trainable_params * trainable_bytes
    if not setup.zero and not setup.fsdp:
        if n == 1:
            return ShardPlan(weights, grads, 0, states, optimizer_temp, 0, 0, 0)
        return ShardPlan(weights, grads, grads, states, optimizer_temp, 0, 0, NCCL_BYTES,
                         ("DDP: full replica per GPU plus gradient buckets the size of the gradients",))
    pt = trainable_params
    layer16 = model.largest_layer_params * compute_bytes
    if setup.quant_bits is not None and layer_stored_bytes:
        # A quantized base is sharded, gathered and (under FSDP) flattened as stored: packed 4/8-bit codes
        # and their metadata (bitsandbytes bnb_4bit_quant_storage, torchao NF4 shards), not 16-bit weights.
        layer16 = min(layer16, layer_stored_bytes)
    notes: list[str] = []
    host = 0
    if setup.fsdp:
        if setup.precision.endswith("-mixed") and compute_bytes == 2 and trainable_bytes == 2:
            # MixedPrecision keeps the sharded trainable params, their grads and states in fp32.
            weights += trainable_params * 2
            grads *= 2
            states *= 2
        w = -(-weights // n)
        # current + prefetched block unit, unsharded in 16 bits; and the root unit (embeddings, lm_head, final
        # norm: what the block-wise auto-wrap leaves to the root), which FSDP does not reshard after forward
        # (FSDP1 _runtime_utils._post_forward_reshard: `not state._is_root`; FSDP2 only when
        # reshard_after_forward is left to auto, _fsdp_state.py)
        root16 = model.params_non_block * compute_bytes if root_embeddings else 0
        gathered = fsdp_layers_gathered(setup) * layer16 + root16
        g = -(-grads // n)
        st = -(-states // n)
        tmp = -(-optimizer_temp // n)
        buffers = fsdp_reduce_scatter_input(model, setup, trainable_params, trainable_bytes, compute_bytes)
        if setup.offload != "none":
            host += g + st + (w if setup.offload == "all" else 0)
            st, g, tmp = 0, 0, 0
            if setup.offload == "all":
                w = 0
        if setup.fsdp_version == 1:
            notes.append(f"FSDP FULL_SHARD: params, grads and optimizer states sharded over {n} GPUs")
        from tuneplan.specs.profiles import get_profile

        if get_profile(setup.framework).model_code != "hf":
            # frameworks with their own model code and loops (LitGPT's no_sync accumulation, torchtune) are
            # not simulated: their reduce-scatter input stays counted in every phase, as before
            return ShardPlan(w, g, buffers, st, tmp, gathered, host, NCCL_BYTES if n > 1 else 0, tuple(notes))
        if setup.fsdp_version == 2:
            f2 = fully_shard_terms(model, setup, buffers, compute_bytes, grads, trainable_params)
            return ShardPlan(w, g, 0, st, tmp, 2 * layer16 + f2.held, host, NCCL_BYTES if n > 1 else 0,
                             (f"FSDP2 fully_shard: each parameter sharded over {n} GPUs",),
                             transient_grad_buffers=f2.transient, gathered_outside_layers=f2.tail16,
                             grads_pending_bottom=f2.pending_bottom, end_of_backward=f2.end,
                             gathered_forward_end=f2.tail16 + (f2.tail16 if model.lm_head_params
                                                               else layer16),
                             top_layer=(buffers, buffers, 2 * layer16 + f2.held_top, True))
        # the HF Trainer's FSDP1 (simulated): the unsharded gradient exists only while its unit is
        # back-propagated and reduce-scattered, not at the loss or in the forward
        # at the loss: the root (kept unsharded) and the last layer, which the root's pre-backward hook
        # prefetches (BACKWARD_PRE) before any layer's backward; the forward gathers one layer at a time
        # (limit_all_gathers, no forward prefetch)
        at_loss = layer16 + root16
        if setup.offload != "none" and (setup.method != "full" or not fsdp1_param_mixed_precision(setup)):
            # a unit whose flat parameter is already in the param dtype (no MixedPrecision, or frozen
            # 16-bit weights / bf16-stored 4-bit codes: _uses_param_mixed_precision False) has no
            # low-precision shard: pre_unshard copies its host shard to the device for the all-gather
            # (FlatParamHandle.flat_param_to) and the original parameters stay views of that copy
            # (_use_sharded_views) until the unit reshards: 1/N of every unsharded unit beside it (torch
            # 2.13 torch/distributed/fsdp/_flat_param.py pre_unshard; simulate: FSDP1 on a fake process
            # group). A full fine-tune's fp32 units under MixedPrecision all-gather their bf16 _mp_shard.
            gathered += -(-gathered // n)
            at_loss += -(-at_loss // n)
        # the top layer's end (FSDP1 use_orig_params: each parameter's gradient is a view's gradient; autograd
        # concatenates them into the flat parameter's unsharded gradient, a cat whose inputs and output are
        # live together, before _post_backward_hook reduce-scatters it), while the root's head gradient, made
        # at the loss, waits for the root's post-backward at the very end (simulate: FSDP1, Llama-2-7B)
        head_wait = 0
        if setup.method == "full" and root_embeddings:
            head_wait = (model.lm_head_params or model.embed_params) * (
                compute_bytes if setup.precision.endswith("-mixed") else trainable_bytes)
        return ShardPlan(w, g, 0, st, tmp, gathered, host, NCCL_BYTES if n > 1 else 0, tuple(notes),
                         transient_grad_buffers=buffers, gathered_outside_layers=at_loss,
                         top_layer=(buffers, 2 * buffers + head_wait, gathered, False))
    # DeepSpeed: trainable params live in 16 bits; fp32 master + fp32 Adam states partitioned.
    w16 = weights - trainable_weight_params * max(trainable_bytes - compute_bytes, 0)
    if trainable_bytes > compute_bytes and trainable_params > trainable_weight_params:  # adapters too
        w16 -= (trainable_params - trainable_weight_params) * (trainable_bytes - compute_bytes)
    master = 4 * pt if compute_bytes < 4 else 0
    # DeepSpeed's own Adam keeps fp32 states next to the fp32 master; other optimizers keep theirs.
    adam_fp32 = 8 * pt if optimizer in ("adamw", "adamw-fused") else states
    st = -(-(master + adam_fp32) // n)
    g16 = pt * compute_bytes
    reduce_bucket = setup.ds_reduce_bucket or DS_REDUCE_BUCKET
    prefetch_bucket = setup.ds_prefetch_bucket or DS_PREFETCH_BUCKET
    # With contiguous_gradients (DeepSpeed's default) the IPG bucket is allocated at its full
    # reduce_bucket_size in the 16-bit dtype, however few parameters train (a LoRA run holds the same
    # 1 GB at the 5e8 default): stage_1_and_2.py setup_buckets() in every backward (a second one only
    # with overlap_comm, off by default below stage 3), stage3.py __init__ once. DeepSpeed 0.19 source.
    bucket = reduce_bucket * compute_bytes
    gathered = 0
    # DeepSpeedZeroOptimizer serves stages 1 and 2 (stage_1_and_2.py); its contiguous reduce bucket is
    # allocated in both; stage 2 additionally partitions the gradients.
    # overlap_comm (off by default below stage 3) double-buffers it: setup_buckets' buf_1
    buffers12 = bucket * (2 if setup.ds_overlap_comm else 1)
    if setup.zero == 1:
        g_live, buffers = g16, buffers12
    elif setup.zero == 2:
        g_live, buffers = -(-g16 // n), buffers12
    else:
        g_live, buffers = -(-g16 // n), bucket
        shard16 = -(-w16 // n)
        # the current layer plus the prefetch bucket, never more than the rest of the model
        gathered = min(layer16 + prefetch_bucket * compute_bytes, w16 - shard16)
        # at most the whole 16-bit model gathered: a gathered parameter is whole, beside rank 0's partition
        whole16 = w16
        w16 = shard16
    offload_grad_buffer = 0
    # fp32 gradient partition the optimizer step reads (a copy only when gradients are 16-bit)
    fp32_grad_step = -(-4 * pt // n) if compute_bytes < 4 else 0
    tmp = fp32_grad_step
    if setup.offload in ("optimizer", "all"):
        host += st + fp32_grad_step
        st, tmp = 0, 0
        notes.append("optimizer states, fp32 master and fp32 gradients offloaded to CPU")
        if setup.zero in (1, 2):
            # stage_1_and_2.py (DeepSpeed 0.19.8) with cpu_offload: __init__ keeps
            # temp_grad_buffer_for_gpu_offload (the largest trainable parameter, 16 bits) on the device for
            # the run; ZeRO-2's reduced partitions go straight to the host fp32 gradient buffer
            # (copy_grads_in_partition -> async_inplace_copy_grad_to_fp32_buffer_from_gpu, then
            # clear_grad_attribute): no device gradient partition
            offload_grad_buffer = largest_trainable * compute_bytes
            if setup.zero == 2:
                g_live = 0
            # and on the host beside the fp32 master: param_buffer_of_bit16_for_cpu_offload_groups (the 16-bit
            # partition) and temp_grad_buffer_for_cpu_offload (the largest trainable parameter, 16 bits)
            host += -(-g16 // n) + offload_grad_buffer
    if setup.offload == "all":
        host += w16
        w16 = 0
        notes.append("parameters offloaded to CPU; only gathered layers live on the GPU")
    notes.append(f"DeepSpeed ZeRO-{setup.zero} over {n} GPUs (default buckets)")
    if setup.zero in (1, 2):
        # DeepSpeedZeroOptimizer allocates the bucket when the first gradient is ready (process_gradients ->
        # setup_buckets) and frees it at the end of the backward (independent_gradient_partition_epilogue
        # -> _release_ipg_buffers), DeepSpeed 0.19.8: it is there while layers are back-propagated only,
        # not at the loss nor in the step (simulate: DeepSpeed's engine on a fake process group)
        at_embedding = zero12_grads_at_embedding(model, setup, trainable_params, g16, g_live, buffers,
                                                 reduce_bucket)
        at_embedding += offload_grad_buffer if at_embedding >= 0 else 0
        return ShardPlan(w16, g_live, offload_grad_buffer, st, tmp, gathered, host,
                         NCCL_BYTES if n > 1 else 0, tuple(notes), transient_grad_buffers=buffers,
                         grads_at_embedding=at_embedding,
                         layers_hold_embedding_grad=setup.zero == 1)
    # ZeRO-3 (stage3.py __init__, DeepSpeed 0.19.8): the gradient partitions are one flat buffer allocated at
    # construction (grad_partitions_flat_buffer, zeros, kept for the run), beside the IPG bucket; at the
    # loss the output head's weight is gathered whole (its forward ran last; it is used again in backward)
    head = model.lm_head_params or model.embed_params
    kept = zero3_layers_kept(model, head) * model.largest_layer_params * compute_bytes
    head16 = head * compute_bytes
    at_loss = min(head16 + kept, whole16)
    layer_gathered = min(max(gathered, kept), whole16)
    # the top layers' backward: what the prefetcher keeps gathered there, and when the IPG bucket is first
    # reduced in one of them, the copy reduce_scatter_coalesced makes of it (the larger of the two instants)
    filled = zero3_bucket_flush(model, setup, reduce_bucket)
    top_gathered = layer_gathered
    at_flush = layer_gathered
    if setup.quant_bits is None:
        ahead = zero3_gathered_ahead(model, setup, prefetch_bucket)
        at_loss = max(at_loss, min(ahead * compute_bytes, whole16))
        if ahead:
            top16 = zero3_gathered_in_backward(model, setup) * compute_bytes
            top_gathered = max(top_gathered, min(top16, whole16))
            # every parameter whose gradient is in the bucket has finished its backward and been released
            done = max(filled - model.lm_head_params, 0)
            flush_instant16 = zero3_gathered_in_backward(model, setup, done) * compute_bytes
            at_flush = max(at_flush, min(flush_instant16, whole16))
    top_gathered = max(top_gathered, at_flush + filled * compute_bytes if filled else 0)
    top_layer = (0, 0, top_gathered, True) if top_gathered > layer_gathered else None
    if setup.offload != "none":
        # the flat gradient partition lives where the optimizer steps (stage3 self.device: the CPU)
        host += g_live
        g_live = 0
    return ShardPlan(w16, 0, buffers + g_live, st, tmp, min(max(gathered, kept), whole16), host,
                     NCCL_BYTES if n > 1 else 0, tuple(notes),
                     gathered_outside_layers=at_loss, top_layer=top_layer)


def zero12_grads_at_embedding(model: ModelSpec, setup: TrainSetup, trainable_params: int, g16: int,
                              g_live: int, bucket_bytes: int, bucket_elements: int) -> int:
    """Gradient bytes alive under ZeRO-1/2 while the token embedding is back-propagated (a full fine-tune;
    the embedding is the last parameter whose gradient autograd makes), the embedding's own gradient and
    the backward kernel's temporaries excluded (memory.embedding_backward_row adds those); -1 when the
    instant is not modelled (LoRA: a frozen embedding; ZeRO-1 with accumulation).

    DeepSpeed 0.19.8, ``runtime/zero/stage_1_and_2.py``:
    - ``process_gradients`` runs ``setup_buckets`` on the first ready gradient: the contiguous-gradients
      bucket is allocated whole and stays until ``_release_ipg_buffers`` at the end of the backward;
    - ZeRO-1 (``partition_gradients`` False, no ``overlap_comm``): the hook does not call
      ``reduce_ready_partitions_and_remove_grads``; every 16-bit gradient stays in ``param.grad`` until the
      epilogue;
    - ZeRO-2: each gradient is copied into the bucket (``reduce_independent_p_g_buckets_and_remove_grads``);
      only when the next one would overflow ``reduce_bucket_size`` does ``reduce_ipg_grads`` run, and its
      ``copy_grads_in_partition`` allocates ``grads_in_partition`` (this rank's 1/N partition, 16 bits).
      While the embedding's gradient is being made its hook has not fired: the partition exists only if
      the other trainable parameters overflowed the bucket before."""
    if setup.method != "full":
        return -1
    emb = model.embed_params
    if setup.zero == 1:
        if setup.grad_accum > 1:
            return -1
        return max(g16 - emb * (g16 // max(trainable_params, 1)), 0) + bucket_bytes
    partition = g_live if trainable_params - emb > bucket_elements else 0
    return partition + bucket_bytes


# Trainers that wrap each LoRA matrix in an FSDP unit of its own: the HF Trainer (transformers
# update_fsdp_plugin_peft sets PEFT's fsdp_auto_wrap_policy: decoder layers, plus every leaf module with a
# trainable weight), and LLaMA-Factory, which trains through it; Answer.AI's fsdp_qlora train.py
# (get_wrapping_policy: decoder layers or leaf modules whose weight requires grad).
PEFT_UNIT_WRAP = ("hf", "llamafactory", "fsdp-qlora")


def fsdp_layers_gathered(setup: TrainSetup) -> int:
    """Decoder layers unsharded at once while a layer is back-propagated (FSDP1 BACKWARD_PRE).

    FSDP1 prefetches the handle that follows in reverse forward order (``_runtime_utils._prefetch_handle``,
    ``_exec_order_utils.get_handle_to_backward_prefetch``): with one unit per layer that is the next layer,
    so two layers are unsharded. When each adapter is a unit of its own inside the layer (PEFT's wrap), the
    handle after a layer is its last adapter unit, and the next layer is gathered only when the layer's
    first adapter (in forward order) starts its backward, after the layer's own matmuls: one layer is
    unsharded through the heavy part of each layer's backward (simulate: FSDP1 on a fake process group)."""
    if setup.is_lora and setup.framework in PEFT_UNIT_WRAP:
        return 1
    return 2


def fsdp1_param_mixed_precision(setup: TrainSetup) -> bool:
    """Whether FSDP1 runs with a ``MixedPrecision`` param dtype as accelerate sets it for the HF Trainer
    (``set_mixed_precision`` for the ``-mixed`` precisions; ``update_fsdp_plugin_peft`` for QLoRA's floating
    ``bnb_4bit_quant_storage``); pure 16-bit and fp32 runs have none."""
    return setup.precision.endswith("-mixed") or setup.method == "qlora"


def fsdp_reduce_scatter_input(model: ModelSpec, setup: TrainSetup, trainable_params: int,
                              trainable_bytes: int, compute_bytes: int) -> int:
    """The unsharded gradient of the unit being reduce-scattered (FSDP1 ``_post_backward_hook``: the flat
    gradient autograd made for the unit, in the reduce dtype, alive until ``reduce_scatter_tensor`` fills the
    new sharded gradient). A frozen unit makes none: in a LoRA run only the adapters' units do, one
    layer's adapters at most."""
    from tuneplan.specs.profiles import get_profile

    per_layer = -(-trainable_params // max(model.n_layers, 1))
    grad_bytes = compute_bytes if setup.precision.endswith("-mixed") else trainable_bytes
    if setup.is_lora and get_profile(setup.framework).fsdp_mixed_unit_grads:
        # one flat parameter per block holding frozen and trainable weights: its gradient covers the
        # whole block (estimator/fsdp_grads.py)
        return model.largest_layer_params * compute_bytes
    if setup.is_lora:
        return per_layer * grad_bytes
    return min(model.largest_layer_params, trainable_params) * grad_bytes


@dataclass(frozen=True)
class FullyShardTerms:
    held: int  # beyond the current and the prefetched layer, unsharded through a layer's backward
    transient: int  # unsharded gradients made by the layer being back-propagated (and a tied head's)
    tail16: int  # unsharded at the loss
    pending_bottom: int  # sharded gradients not made yet at the second layer's backward
    # the embedding's backward: (unsharded gradients less the shards not made yet, unsharded parameters)
    end: tuple[int, int] | None
    held_top: int = 0  # as ``held``, through the top layer's backward


def fully_shard_terms(model: ModelSpec, setup: TrainSetup, layer_grads: int, compute_bytes: int,
                      grads: int, trainable_params: int) -> FullyShardTerms:
    """FSDP2 (``fully_shard``, as accelerate's ``fsdp2_prepare_model`` applies it), torch 2.13 source.

    Groups: each decoder layer; the input embeddings (untied) with ``reshard_after_forward=True``; the
    tail (final norm and output head, with the embeddings when tied) with ``reshard_after_forward=False``.

    - In the forward, ``wait_for_unshard`` keeps a group's flat all-gather output in
      ``comm_ctx.all_gather_state`` until the next group's copy-out, and the root's post-forward frees the
      last one: transformers computes the loss inside the root's forward, so at the loss the last group
      gathered (the untied tail, or the last layer when the tail gathered first at the tied embeddings)
      still has its flat buffer next to the unsharded tail.
    - At the loss backward only the tail is unsharded: the last layer was resharded after its forward, the
      root's post-forward freed the last all-gather result, and the backward prefetch of the last layer waits
      for the tail's pre-backward hook, which the logits' gradient fires after the loss backward.
    - ``_backward_prefetch``: a group's pre-backward all-gathers the group before it in forward order into
      one flat buffer (a layer in the param dtype), alive until that group's copy-out: two layers unsharded.
    - ``foreach_reduce`` keeps a group's flat reduce-scatter input (its unsharded gradients in the reduce
      dtype) in ``comm_ctx.reduce_scatter_state`` until the next reduce-scatter replaces it: a layer's
      backward holds the previous group's (a layer's gradients, or an untied trainable head's).
    - A group's post-backward hook is registered on its forward inputs that require grad. The embeddings'
      input ids do not: an untied embedding group, and a tied tail (which starts its forward at the
      embeddings), reshard and reduce-scatter only in the root's final callback. A tied tail stays
      unsharded through the whole backward and its head gradient waits there; at the embedding's backward
      the head's and the embedding's gradients and their sum are live (three in the param dtype).
    - The sharded gradient of a group appears after its reduce-scatter: at the second layer's backward
      (the peak near the bottom: the first one prefetches the smaller embedding group) two layers' shards
      and the embedding's (the tied tail's) are still missing. With ``CPUOffloadPolicy`` the sharded
      gradients are copied to the host as they are made (``foreach_reduce``): none is on the device to miss.
    - The top layer is the first back-propagated: the reduce-scatter input held through it is the tail's
      (an untied head that trains), or none; a tied tail stays unsharded. Its unsharded gradients grow as
      its activations are released (``memory_at``'s top-layer row takes the larger of its start and end).
    """
    n = setup.world_size
    tied = not model.lm_head_params
    tail = (model.lm_head_params or model.embed_params) + model.final_norm_params
    tail16 = tail * compute_bytes
    head_trains = setup.method == "full"
    # sharded gradient bytes per trainable element on the device (none under CPUOffloadPolicy: host)
    per_elem = 0 if setup.offload != "none" else grads / max(trainable_params, 1)
    layer_train = layer_grads / max(compute_bytes, 1)
    emb_grad16 = model.embed_params * compute_bytes if head_trains else 0
    if tied:
        held = layer_grads
        transient = layer_grads + emb_grad16
        pending = 2 * layer_train + (tail if head_trains else 0)
        end = (3 * emb_grad16 + layer_grads - -(-int(tail * per_elem) // n), tail16) if head_trains else None
    else:
        held = max(layer_grads, tail * compute_bytes if head_trains else 0)
        transient = layer_grads
        pending = 2 * layer_train + (model.embed_params if head_trains else 0)
        end = ((emb_grad16 + layer_grads - -(-int(model.embed_params * per_elem) // n),
                model.embed_params * compute_bytes) if head_trains else None)
    held_top = tail16 if tied else (tail * compute_bytes if head_trains else 0)
    return FullyShardTerms(held=held + (tail16 if tied else 0), transient=transient, tail16=tail16,
                           pending_bottom=-(-int(pending * per_elem) // n), end=end, held_top=held_top)


def zero3_layers_kept(model: ModelSpec, head_params: int) -> int:
    """Decoder layers whose gathered parameters ZeRO-3 keeps from their forward to their backward.

    ``PartitionedParameterCoordinator.__params_to_release`` (DeepSpeed 0.19.8), once the module trace is
    complete (from the second step): a module's parameters are not released if they are used again
    within ``stage3_max_reuse_distance`` elements of parameters in the traced order. After layer ``L-1-k``'s
    forward come the ``k`` layers above it, the output head, and the backward of those ``k`` layers before
    its own: ``2 k P_layer + P_head`` elements. Layers with that under the distance stay gathered through
    the turn from forward to backward."""
    per_layer = max(model.largest_layer_params, 1)
    room = DS_MAX_REUSE_DISTANCE - head_params
    if room <= 0:
        return 0
    return min(model.n_layers, -(-room // (2 * per_layer)))


def zero3_gathered_ahead(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int) -> int:
    """Parameters (elements) ZeRO-3 holds gathered at the loss once its prefetcher has run ahead of the
    forward into the backward part of the trace (0 when it cannot run ahead).

    ``PartitionedParameterCoordinator._fetch_sub_module_impl`` (DeepSpeed 0.19.8), complete trace: every
    module's fetch, a parameterless one too, prefetches up to ``min(max_live - n_available,
    prefetch_bucket)`` elements of NOT_AVAILABLE parameters from the trace queue (the last one may overshoot),
    and pops the AVAILABLE ones it meets without counting them, recording their later use in
    ``__most_recent_step_id_param_fetched_for``. When the fetches of a layer's modules grant more than the
    layer holds, the queue runs ahead into the backward part of the trace during the forward; from then on
    ``__params_to_release`` keeps every parameter whose backward use the prefetcher recorded: at the loss,
    every parameter with a backward use is gathered, up to ``stage3_max_live_parameters`` plus one
    parameter's overshoot. Parameters with no backward use are released after their forward: in a LoRA run
    without checkpointing the frozen embedding and the first layer's frozen projections that read its
    input (their outputs do not require grad, so no pre-backward hook fetches them again).
    (simulate: DeepSpeed's engine on a fake process group, Llama-2-7B layers, full + checkpointing and
    LoRA; the coordinator's state read at the loss.)"""
    fetches = max(len(spec.linears) + 2 + HOOKED_CONTAINERS_PER_LAYER for spec, _ in model.layer_groups)
    if fetches * prefetch_bucket < model.largest_layer_params or setup.method not in ("full", "lora"):
        return 0
    used = zero3_backward_uses(model, setup)
    largest = max([model.vocab * model.hidden, model.lm_head_params]
                  + [m.params for spec, _ in model.layer_groups for m in spec.linears])
    return min(used, DS_MAX_LIVE_PARAMETERS + largest)


def zero3_backward_uses(model: ModelSpec, setup: TrainSetup) -> int:
    """Parameters (elements) the backward fetches again under ZeRO-3: all of them, less, in a LoRA run without
    checkpointing, the frozen embedding and the first layer's frozen projections that read its input
    (zero3_gathered_ahead)."""
    used = model.params_total
    if setup.method == "lora" and not setup.gradient_checkpointing:
        first = model.layer_groups[0][0]
        used -= model.embed_params + sum(m.params for m in first.linears if m.reads == "attn_in")
    return used


def zero3_gathered_in_backward(model: ModelSpec, setup: TrainSetup, done: int = 0) -> int:
    """Parameters (elements) ZeRO-3 holds gathered while the top decoder layers are back-propagated, once
    its prefetcher runs ahead (zero3_gathered_ahead > 0).

    ``PartitionedParameterCoordinator`` (DeepSpeed 0.19.8): ``release_sub_module`` frees the untied output
    head after its backward (it is not used again), and every later module fetch refills from the trace queue:
    ``_fetch_sub_module_impl`` prefetches while ``numel_prefetching < min(__max_n_available_params -
    __n_available_params, __prefetch_bucket_sz)``, so ``__n_available_params`` (what ``__all_gather_params_``
    added and ``__release_param`` took off) climbs back to ``stage3_max_live_parameters`` plus the last
    parameter popped, which crosses the limit. While the top layers run, the queue holds layer parameters
    (the token embedding is the trace's last use): the overshoot is at most the largest layer parameter.
    When the parameters still to be used (less ``done``: those already back-propagated below the head,
    which ``release_sub_module`` freed after their backward) fit under that, all of them are gathered.
    (simulate: Llama-2-7B, 8 layers, ZeRO-3 over 8 GPUs, the coordinator's count read at every module
    fetch and release: 1.00e9 to 1.034e9 elements through the top two layers' backward.)"""
    after_head = zero3_backward_uses(model, setup) - model.lm_head_params - done
    largest = max(m.params // m.count for spec, _ in model.layer_groups for m in spec.linears)
    return min(after_head, DS_MAX_LIVE_PARAMETERS + largest)


def zero3_bucket_flush(model: ModelSpec, setup: TrainSetup, reduce_bucket: int) -> int:
    """Gradient elements in the ZeRO-3 IPG bucket when it is first reduced during the backward; 0 when every
    gradient fits, so that the only reduction is the backward's epilogue, or when the run is not a full
    fine-tune.

    stage3.py (DeepSpeed 0.19.8) ``reduce_independent_p_g_buckets_and_remove_grads``: when the next gradient
    would take the bucket past ``reduce_bucket_size``, ``__reduce_and_partition_ipg_grads`` runs first; with
    ``reduce_scatter`` on (the default) it calls ``__avg_scatter_grads`` -> ``reduce_scatter_coalesced``
    (runtime/comm/coalesced_collectives.py), whose ``torch.cat`` of the interleaved, padded gradient chunks
    is a new tensor of the bucket's elements in the 16-bit dtype, live beside the bucket while the layer is
    back-propagated. Gradients arrive in the backward's order: the untied head, the final norm, then each
    layer from the top, its linears last-to-first (its norms counted after them)."""
    if setup.method != "full":
        return 0
    filled = model.lm_head_params + model.final_norm_params
    for spec, count in reversed(model.layer_groups):
        per_layer = [m.params // m.count for m in reversed(spec.linears) for _ in range(m.count)]
        per_layer.append(spec.norm_params)
        for numel in per_layer * count:
            if filled and filled + numel > reduce_bucket:
                return filled
            filled += numel
    return 0
