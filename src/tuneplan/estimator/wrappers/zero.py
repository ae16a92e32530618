"""DeepSpeed ZeRO stages 1, 2 and 3, with and without CPU offload (ZeRO-Offload, ZeRO-Infinity).

With bf16/fp16: module parameters in 16 bits, an fp32 master partition (4/N B per trainable param) and fp32
Adam states (8/N) in DeepSpeed's own optimizer (FusedAdam: no foreach workspace); the partitioning of the
ZeRO paper (arXiv 1910.02054). Buffers from DeepSpeed's defaults (deepspeed/runtime/zero/config.py):
``reduce_bucket_size`` 5e8 elements (the contiguous-gradients bucket, allocated whole whatever the trainable
count), stage-3 ``prefetch_bucket_size`` 5e7 elements. ZeRO-1 keeps full 16-bit gradients; ZeRO-2 keeps a
16-bit gradient partition plus the reduce bucket; ZeRO-3 also partitions all parameters and gathers the
current layer and the prefetch bucket. Offload: optimizer states, fp32 master and fp32 gradients to CPU
(``offload_optimizer``), and with ``all`` the parameters too (``offload_param``); reported as host memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from tuneplan.estimator.links import ring_factor
from tuneplan.estimator.optimizer import OptimizerPlan
from tuneplan.estimator.wrappers import zero3_expert_round as fused_experts
from tuneplan.estimator.wrappers import zero3_flush as first_flush
from tuneplan.estimator.wrappers import zero3_lora_top_backward as lora_top
from tuneplan.estimator.wrappers import zero3_plain_trace as plain
from tuneplan.estimator.wrappers.base import (
    Buckets,
    Collectives,
    EmbeddingGradients,
    Gathered,
    Resident,
    ShardingWrapper,
    TopLayer,
    Wrapper,
    WrapperMemory,
    nccl_bytes,
    sixteen_bit_wire,
)
from tuneplan.estimator.wrappers.reduce_buckets import first_hook_after_stacks
from tuneplan.estimator.wrappers.zero1_bottom import zero1_bottom_layer
from tuneplan.estimator.wrappers.zero1_offload import zero1_offload_epilogue
from tuneplan.estimator.wrappers.zero2_partition import past_mlp_scratch_per_token, zero2_backward
from tuneplan.estimator.wrappers.zero3_bottom_forward import zero3_gathered_at_first_linear
from tuneplan.estimator.wrappers.zero3_coordinator import (
    zero3_gathered_ahead,
    zero3_gathered_at_embedding,
    zero3_gathered_at_head_backward,
    zero3_gathered_at_top_forward,
    zero3_gathered_in_backward,
    zero3_head_round,
    zero3_head_round_first_pass,
)
from tuneplan.estimator.wrappers.zero3_first_pass import (
    head_round_before_first_step,
    zero3_embedding_backward,
    zero3_first_pass_round,
)
from tuneplan.estimator.wrappers.zero3_head_flush_rounds import zero3_head_flush_bytes
from tuneplan.estimator.wrappers.zero3_head_pop import zero3_forward_most
from tuneplan.estimator.wrappers.zero3_head_reuse import zero3_recorded_bytes
from tuneplan.estimator.wrappers.zero3_leaf_embedding import with_kept_embedding
from tuneplan.estimator.wrappers.zero3_lower_backward import zero3_lower_layers_gathered
from tuneplan.estimator.wrappers.zero3_lower_flush import zero3_lower_flush_moment
from tuneplan.estimator.wrappers.zero3_module_trace import (
    zero3_replayed_forward,
    zero3_replayed_gathered,
)
from tuneplan.estimator.wrappers.zero3_packed_prefetch import zero3_layer_and_prefetch_bytes
from tuneplan.estimator.wrappers.zero3_quantized import (
    zero3_kept_bytes,
    zero3_quantized_ahead_bytes,
    zero3_quantized_at_embedding_bytes,
    zero3_quantized_head_copy_bytes,
)
from tuneplan.estimator.wrappers.zero3_quantized_embedding import zero3_quantized_embedding_round
from tuneplan.estimator.wrappers.zero3_record_release import zero3_quantized_record_release_copy
from tuneplan.estimator.wrappers.zero3_saved_views import with_views_at_top_forward, zero3_views_kept
from tuneplan.estimator.wrappers.zero3_shared_moe_trace import zero3_shared_moe_backward
from tuneplan.estimator.wrappers.zero3_tied_gradient import zero3_tied_head_gradient
from tuneplan.estimator.wrappers.zero3_tied_head import zero3_tied_head_round
from tuneplan.estimator.wrappers.zero12_flatten import zero12_flatten_bytes
from tuneplan.estimator.wrappers.zero12_initialize import zero12_initialize_bytes
from tuneplan.estimator.wrappers.zero12_reductions import (
    largest_trained_param,
    zero1_epilogue,
    zero12_grads_at_embedding,
    zero12_rank0_params,
    zero12_step,
)
from tuneplan.estimator.wrappers.zero_terms import (
    DeepSpeedTerms,
    deepspeed_adapters,
    deepspeed_terms,
    reduce_bucket_elements,
)
from tuneplan.estimator.xp import ceil_div
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.links import Link
    from tuneplan.estimator.run import Run

class Zero(Wrapper):
    """What the stages share: the optimizer partition, the collectives' wire format and the host offload."""

    stage: ClassVar[int]
    shards_optimizer = True

    @classmethod
    def applies(cls, setup: TrainSetup) -> bool:
        return setup.zero == cls.stage

    def gradient_wire_bytes(self, run: Run) -> int:
        return sixteen_bit_wire(run)

    def offloaded(self, run: Run, terms: DeepSpeedTerms) -> tuple[int, int, int, list[str]]:
        """(optimizer states on the GPU, the step's temporaries, bytes on the host, notes) with
        ``offload_optimizer``: the states, the fp32 master and the fp32 gradients on the CPU."""
        if run.setup.offload in ("optimizer", "all"):
            return 0, 0, terms.states + terms.fp32_grad_step, [
                "optimizer states, fp32 master and fp32 gradients offloaded to CPU"]
        return terms.states, terms.step_temp, 0, []

    def resident(self, run: Run, weights: int, states: int, temp: int, grads: int, host: int) -> Resident:
        """``weights`` on this GPU split into the base model's and the adapters (deepspeed_adapters)."""
        adapters = deepspeed_adapters(run, weights)
        return Resident(weights=max(weights - adapters, 0), adapters=adapters, states=states,
                        optimizer_temp=temp, gradients=grads, host=host, nccl=nccl_bytes(run.setup))

    @staticmethod
    def notes(setup: TrainSetup, notes: list[str]) -> tuple[str, ...]:
        if setup.offload == "all":
            notes.append("parameters offloaded to CPU; only gathered layers live on the GPU")
        notes.append(f"DeepSpeed ZeRO-{setup.zero} over {setup.world_size} GPUs (default buckets)")
        return tuple(notes)


class ZeroOneTwo(Zero):
    """``DeepSpeedZeroOptimizer`` (stage_1_and_2.py) serves stages 1 and 2; its contiguous reduce bucket is
    allocated in both; stage 2 additionally partitions the gradients."""

    partitions_gradients: ClassVar[bool]

    def memory(self, run: Run, optimizer: OptimizerPlan) -> WrapperMemory:
        setup, compute = run.setup, run.dtypes.compute
        world_size = setup.world_size
        terms = deepspeed_terms(run, optimizer)
        grads16 = terms.grads16
        # overlap_comm (off by default below stage 3) double-buffers the bucket: setup_buckets' buf_1
        buffers = terms.bucket * (2 if setup.ds_overlap_comm else 1)
        g_live = (zero12_rank0_params(run, ceil_div(run.param_plan.trainable_params, world_size)) * compute
                  if self.partitions_gradients else grads16)
        states, temp, host, notes = self.offloaded(run, terms)
        offload_grad_buffer = 0
        if setup.offload in ("optimizer", "all"):
            # stage_1_and_2.py (DeepSpeed 0.19.8) with cpu_offload: __init__ keeps
            # temp_grad_buffer_for_gpu_offload (the largest trainable parameter, 16 bits) on the device for
            # the run; ZeRO-2's reduced partitions go straight to the host fp32 gradient buffer
            # (copy_grads_in_partition -> async_inplace_copy_grad_to_fp32_buffer_from_gpu, then
            # clear_grad_attribute): no device gradient partition
            offload_grad_buffer = largest_trained_param(run) * compute
            if self.partitions_gradients:
                g_live = 0
            # and on the host beside the fp32 master: param_buffer_of_bit16_for_cpu_offload_groups (the 16-bit
            # partition) and temp_grad_buffer_for_cpu_offload (the largest trainable parameter, 16 bits)
            host += ceil_div(grads16, world_size) + offload_grad_buffer
        weights = terms.weights16
        if setup.offload == "all":
            host += weights
            weights = 0
        # DeepSpeedZeroOptimizer allocates the bucket when the first gradient is ready (process_gradients ->
        # setup_buckets) and frees it at the end of the backward (independent_gradient_partition_epilogue
        # -> _release_ipg_buffers), DeepSpeed 0.19.8: it is there while layers are back-propagated only,
        # not at the loss nor in the step (simulate: DeepSpeed's engine on a fake process group)
        held = offload_grad_buffer + buffers
        epilogue, in_layers, kept, made, at_head, records, at_bottom = (
            zero2_backward(run, terms.reduce_bucket, held, g_live) if self.partitions_gradients  # ZeRO-2
            else ((zero1_offload_epilogue if setup.offload != "none" else zero1_epilogue)(
                run, terms.reduce_bucket, held, g_live), 0, 0, False, 0, (), 0))
        # without accumulation, where no reduction of the layers' backward holds this rank's gradients, the
        # partition is made only by the epilogue: the layers' rows lack it; made by the bottom layer's
        # reduction past its MLP block, the bottom row (its activations whole) lacks it too
        lack = at_bottom if made else 0 if kept or not self.partitions_gradients else g_live
        at_embedding = zero12_grads_at_embedding(run.model, setup, run.param_plan.trainable_params, grads16,
                                                 g_live, buffers, made)
        embedding = None
        if at_embedding >= 0:
            embedding = EmbeddingGradients(at_embedding + offload_grad_buffer + kept, layers_hold_it=(
                not self.partitions_gradients and setup.grad_accum == 1))
        step_gradients, temp = (zero12_step(run, terms) if setup.offload == "none" else (0, temp))
        # ZeRO-1 reduces only at the accumulation boundary (DeepSpeed 0.19.8: engine.allreduce_gradients calls
        # reduce_gradients, whose epilogue frees the bucket in _release_ipg_buffers, only there): the bucket
        # setup_buckets allocated in an accumulating micro-batch's backward stays (ready_for_gradients is
        # still set) through the next micro-batch's forward and loss, and is reused by its backward
        through = buffers if not self.partitions_gradients and setup.grad_accum > 1 else 0
        return WrapperMemory(self.resident(run, weights, states, temp, g_live, host),
                             Buckets(persistent=offload_grad_buffer, in_layers=buffers,
                                     through_forward=through, missing_at_bottom=lack),
                             embedding=embedding, step_gradients=step_gradients, epilogue=epilogue,
                             layers_backward=in_layers, head_backward=at_head,
                             reduction_moments=records, partition_at_bottom=at_bottom,
                             past_mlp_scratch=past_mlp_scratch_per_token(run), initialize=max(
                                 zero12_initialize_bytes(run), zero12_flatten_bytes(run, terms.weights16)),
                             first_hook_bucket=buffers if setup.is_lora and not through else 0,
                             first_hook_after_stacks=first_hook_after_stacks(run.model, run.targets,
                                                                             setup.rank),
                             bottom_layer=zero1_bottom_layer(run),
                             notes=self.notes(setup, notes))

    def ring_collectives(self, run: Run, *, grad_bytes: int, gathered_bytes: int, link: Link) -> Collectives:
        """The gradients reduce-scattered (ZeRO-2: every micro-batch; ZeRO-1: once per step), the updated
        16-bit parameters all-gathered once per step."""
        world_size, trainable = run.setup.world_size, run.param_plan.trainable_params
        bandwidth = link.gbs * 1e9
        reduce = trainable * grad_bytes * ring_factor("reduce_scatter", world_size) / bandwidth
        gather = trainable * 2 * ring_factor("all_gather", world_size) / bandwidth
        if self.partitions_gradients:
            return Collectives(per_micro_batch=reduce, serial=gather,
                               notes=("ZeRO-2: reduce-scatter gradients every micro-batch, all-gather "
                                      "updated 16-bit params per step",))
        return Collectives(per_step=reduce, serial=gather,
                           notes=("ZeRO-1: reduce-scatter gradients once per step, all-gather updated 16-bit "
                                  "params per step",))

    def last_bucket_bytes(self, run: Run, grad_bytes: int) -> float:
        return reduce_bucket_elements(run.setup) * grad_bytes


class Zero1(ZeroOneTwo):
    name, stage, partitions_gradients = "zero-1", 1, False


class Zero2(ZeroOneTwo):
    name, stage, partitions_gradients = "zero-2", 2, True


class Zero3(Zero, ShardingWrapper):
    """``DeepSpeedZeroOptimizer_Stage3`` (stage3.py): parameters partitioned too, gathered module by module by
    the ``PartitionedParameterCoordinator``."""

    name = "zero-3"
    stage = 3

    def memory(self, run: Run, optimizer: OptimizerPlan) -> WrapperMemory:
        model, setup, compute = run.model, run.setup, run.dtypes.compute
        world_size = setup.world_size
        terms = deepspeed_terms(run, optimizer)
        # at most the whole 16-bit model gathered: a gathered parameter is whole, beside rank 0's partition
        whole16, shard16 = terms.weights16, ceil_div(terms.weights16, world_size)
        # the current layer plus the prefetch bucket, never more than the rest of the model
        gathered = min(zero3_layer_and_prefetch_bytes(run, terms.prefetch_bucket), whole16 - shard16)
        g_live = ceil_div(terms.grads16, world_size)
        states, temp, host, notes = self.offloaded(run, terms)
        weights = shard16
        if setup.offload == "all":
            host += weights
            weights = 0
        # the gradient partitions are one flat buffer allocated at construction (grad_partitions_flat_buffer,
        # zeros, kept for the run), beside the IPG bucket; at the loss the output head's weight is gathered
        # whole (its forward ran last; it is used again in backward)
        head = model.lm_head_params or model.embed_params
        kept = zero3_kept_bytes(run, head)
        # or, the top layer past the reuse distance, what the prefetcher recorded of it (zero3_head_reuse)
        at_loss = min(max(head * compute + kept, zero3_recorded_bytes(run, head)), whole16)
        layer_gathered = min(max(gathered, kept), whole16)
        at_loss, top_gathered, (flush, above, past_mlp) = self.prefetched(run, terms, at_loss, layer_gathered,
                                                                          whole16)
        runs_ahead = zero3_gathered_ahead(model, setup, terms.prefetch_bucket, run.targets)
        # the embedding round's flat buffer: from the forward, or in the bottom layer (zero3_first_pass.py)
        early, at_bottom = zero3_first_pass_round(model, setup, terms.prefetch_bucket, run.targets)
        lower = zero3_lower_layers_gathered(run, terms, layer_gathered, at_bottom, whole16, bool(runs_ahead))
        # released weights a saved ``weight.T`` view keeps beside them (zero3_saved_views.py)
        views = (zero3_views_kept(run, head, terms.prefetch_bucket) + early) * compute
        # dense 16-bit LoRA under checkpointing: the coordinator replayed counts the rounds and views itself
        lower = max(lower, lora_top.zero3_lora_lower_backward_bytes(run, terms.prefetch_bucket) - views)
        layer_gathered, at_loss, top_gathered = layer_gathered + views, at_loss + views, top_gathered + views
        # a flush in the top layer: every lower layer's views still saved
        flush += views if flush and not above else 0
        # without checkpointing, the replayed coordinator past the top MLP's output linear (zero3_plain_trace)
        past_output = plain.zero3_gathered_past_top_mlp_output(run, terms.prefetch_bucket)
        top_row = past_output + views if past_output else max(top_gathered, layer_gathered)
        top_layer = (TopLayer(counted=0, gradients_at_end=0, gathered=top_row, keeps_scratch=True)
                     if top_gathered > layer_gathered or lower > layer_gathered - views else None)
        # a later reduction in a lower layer, beside what is gathered there (zero3_lower_flush.py)
        low_flush = zero3_lower_flush_moment(model, setup, terms.reduce_bucket, run.dtypes, layer_gathered,
                                             bool(runs_ahead))
        layer_gathered = lower + views
        if setup.offload != "none":
            # the flat gradient partition lives where the optimizer steps (stage3 self.device: the CPU)
            host += g_live
            g_live = 0
        embedding = zero3_embedding_backward(model, setup, terms.bucket + g_live, compute)
        at_embedding, at_head = self.forward_rounds(run, terms, at_loss, whole16, bool(runs_ahead))
        out = with_kept_embedding(run, WrapperMemory(self.resident(run, weights, states, temp, 0, host),
                             Buckets(persistent=terms.bucket + g_live,
                                     in_layers=zero3_tied_head_gradient(model, setup, compute)),
                             Gathered(in_layers=layer_gathered, at_loss=at_loss, at_forward_end=at_loss,
                                      bottom_layer_forward=at_embedding, head_forward=at_head,
                                      head_backward=zero3_gathered_at_head_backward(
                                          model, setup, at_loss),
                                      top_layer_backward_fetch=max(
                                          fused_experts.zero3_record_pass_top_bytes(run),
                                          zero3_shared_moe_backward(run, terms.prefetch_bucket)),
                                      states_unmade=(terms.lazy_states if states and not
                                                    fused_experts.zero3_recompute_every_pass(run) else 0),
                                      head_forward_states_unmade=terms.lazy_states if states and at_head
                                      and head_round_before_first_step(model, setup, terms.prefetch_bucket,
                                                                       run.targets) else 0,
                                      top_layer_forward=max(min(zero3_gathered_at_top_forward(
                                          model, setup) * compute, whole16),
                                          fused_experts.zero3_expert_round_bytes(run)),
                                      head_popped=zero3_forward_most(run, terms.prefetch_bucket),
                                      top_layer_past_attention=plain.zero3_gathered_past_top_attention(
                                          run, terms.prefetch_bucket),
                                      flush=flush, flush_layers_above=above, flush_past_mlp=past_mlp,
                                      lower_flush=low_flush,
                                      flush_scratch_per_token=first_flush.zero3_flush_mlp_done_scratch(
                                          model, run.dtypes, terms.reduce_bucket, setup) if flush else 0),
                             top_layer=top_layer, embedding=embedding, epilogue=first_flush.zero3_epilogue(
                                 model, setup, terms.reduce_bucket, compute, terms.bucket + g_live),
                             notes=self.notes(setup, notes)))
        return with_views_at_top_forward(run, out)

    @staticmethod
    def forward_rounds(run: Run, terms: DeepSpeedTerms, at_loss: int, whole16: int,
                       runs_ahead: bool) -> tuple[int, int]:
        """(gathered at the bottom layer's forward, gathered at the head's forward)."""
        model, setup, compute = run.model, run.setup, run.dtypes.compute
        if setup.quant_bits is None and runs_ahead:
            # the first forward instant (the FSDP2 bottom layer's row): the embedding and what the prefetcher
            # ran ahead to while the wrappers above it were fetched, no activation saved yet
            # or at the bottom layer's first linear, a coalesced round held twice (zero3_bottom_forward.py)
            at_embedding = min(max(zero3_gathered_at_embedding(model, setup, terms.prefetch_bucket),
                                   zero3_gathered_at_first_linear(model, setup, terms.prefetch_bucket,
                                                                  run.targets)) * compute, 2 * whole16)
            # the head's forward: what the loss holds, and the head's round (tied: zero3_tied_head.py)
            head_round = (zero3_head_round(model, terms.prefetch_bucket, setup, run.targets)
                          or zero3_tied_head_round(model, setup, run.targets))
            return at_embedding, at_loss + head_round * compute if head_round else 0
        if setup.quant_bits is None:
            # the head alone past the reuse distance: its coalesced first-pass round held twice at the norm
            return 0, zero3_head_round_first_pass(model, setup) * compute
        # 4-bit layers gathered as packed bytes: the prefetcher runs ahead from the embedding on
        # leaf MoE blocks: the coordinator replayed through the bottom layer (zero3_module_trace.py)
        return (max(zero3_quantized_at_embedding_bytes(run, terms.prefetch_bucket),
                    zero3_replayed_forward(run, terms.prefetch_bucket)),
                at_loss + zero3_quantized_head_copy_bytes(run, terms.prefetch_bucket)
                if model.lm_head_params else 0)

    @staticmethod
    def prefetched(run: Run, terms: DeepSpeedTerms, at_loss: int, layer_gathered: int,
                   whole16: int) -> tuple[int, int, tuple[int, int, bool]]:
        """(gathered at the loss, gathered through the top layer's backward, (gathered at the first
        in-backward reduction below it, the layers above, past its MLP)) once the prefetcher runs ahead:
        what it keeps gathered there, and when the IPG bucket is first reduced, the copy
        reduce_scatter_coalesced makes of it, an instant of its own (zero3_flush.py)."""
        model, setup, compute = run.model, run.setup, run.dtypes.compute
        filled = first_flush.zero3_bucket_flush(model, setup, terms.reduce_bucket)
        top_gathered, at_flush = layer_gathered, zero3_head_flush_bytes(run, terms.prefetch_bucket,
                                                                        terms.reduce_bucket, layer_gathered)
        if setup.quant_bits is None:
            ahead = zero3_gathered_ahead(model, setup, terms.prefetch_bucket, run.targets)
            # leaf MoE blocks under checkpointing: the coordinator replayed (zero3_module_trace.py)
            replayed = zero3_replayed_gathered(run, terms.prefetch_bucket)
            at_loss = max(at_loss, replayed.at_loss if replayed else min(ahead * compute, whole16))
            if ahead:
                # dense 16-bit LoRA under checkpointing: the coordinator replayed (zero3_lora_top_backward.py)
                top16 = (lora_top.zero3_lora_top_backward_bytes(run, terms.prefetch_bucket)
                         or zero3_gathered_in_backward(model, setup, targets=run.targets) * compute)
                top_gathered = max(top_gathered, min(top16, whole16))
                at_flush = first_flush.zero3_flush_gathered(model, setup, terms.prefetch_bucket,
                                                            terms.reduce_bucket, run.targets) * compute
        else:
            # packed 4-bit layers: what the prefetcher ran ahead to stays until its backward use (and a copy)
            # (and a copy: the embedding's round joining the forward's last, or, after a record pass that
            # released the persistent parameters, holding the forward's persistent tail); dense layers under
            # checkpointing: the coordinator replayed, zero3_module_trace.py, in the top layer's backward
            # the embedding the prefetcher pops there; without checkpointing, zero3_plain_trace.py
            replayed = (zero3_replayed_gathered(run, terms.prefetch_bucket)
                        or plain.zero3_replayed_plain(run, terms.prefetch_bucket))
            extra = max(zero3_quantized_embedding_round(run, terms.prefetch_bucket)[0],
                        zero3_quantized_record_release_copy(run, terms.prefetch_bucket))
            ahead = (replayed.at_loss if replayed else min(zero3_quantized_ahead_bytes(
                model, setup, terms.prefetch_bucket, compute), whole16)) + extra
            at_loss = max(at_loss, ahead)
            # replayed: the top layer's backward counted fetch by fetch (an untied head released after
            # its own backward), beside the first pass's copies
            top_gathered = max(top_gathered, replayed.top_backward + extra if replayed else ahead)
        flush = (at_flush + first_flush.zero3_flush_scratch(model, setup, terms.reduce_bucket, compute)
                 if filled else 0)
        # the flush is an instant of its own (Gathered.flush), the head's and the layers above's activations
        # released, the layer's scratch then in place of its whole backward's
        above, past_mlp = first_flush.zero3_flush_place(model, setup, terms.reduce_bucket)
        return at_loss, top_gathered, (flush, above, past_mlp)
