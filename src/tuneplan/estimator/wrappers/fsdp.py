"""FSDP: PyTorch's ``FullyShardedDataParallel`` (FSDP1, flat parameters) and ``fully_shard`` (FSDP2).

FULL_SHARD with a bf16 MixedPrecision policy: sharded parameters in their own dtype, the current and the
prefetched unit unsharded in 16 bits (one layer when each adapter is its own unit: ``fsdp_layers_gathered``),
the unsharded gradient of the unit being reduce-scattered (``fsdp_reduce_scatter_input``), sharded fp32
gradients, sharded optimizer states. With CPU offload (FSDP1 ``CPUOffload``, FSDP2 ``CPUOffloadPolicy``) the
sharded gradients and optimizer states live on the host, and with ``all`` the parameter shards too.

Two mechanisms read through profile switches (``tuneplan.specs.profiles``), :func:`no_sync_gradients`:

- Mixed frozen / trainable units. With ``use_orig_params=True`` (Lightning Fabric's ``FSDPStrategy`` sets
  it by default for torch >= 2.0), one FSDP unit may hold frozen and trainable parameters in one
  ``FlatParameter``; the flat parameter then requires grad and its gradient covers every parameter in it.
  PyTorch's FSDP docs: mixing them is supported "but we recommend not doing so since then the gradient
  memory usage will be higher than expected (namely, equivalent to not freezing those parameters)".
  LitGPT wraps each transformer ``Block`` as a unit (``auto_wrap_policy={Block}``), and its LoRA matrices
  live inside the block's linears, so a LoRA run carries gradients for every block weight. The root unit
  (embeddings, lm_head, final norm) holds only frozen parameters in a LoRA run and gets none.
- ``no_sync``. During gradient accumulation the reduce-scatter is skipped and FSDP accumulates the
  *unsharded* gradient of every unit (``FullyShardedDataParallel.no_sync`` docstring: gradients are
  accumulated "in unsharded form", which uses more memory). LitGPT runs every accumulating micro-batch
  under ``fabric.no_backward_sync(model, enabled=is_accumulating)`` (finetune/lora.py, finetune/full.py),
  which maps to ``no_sync`` for the FSDP strategy. Only the last micro-batch of a step reduce-scatters.

Together, a LitGPT FSDP LoRA run with gradient accumulation holds, on every GPU, a full-size gradient of
all block weights next to its weight shard: the per-GPU peak of the litgpt resource tables (e.g. Llama 2
7B LoRA on 2 GPUs above a single-GPU run) follows from this, with nothing fitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuneplan.estimator.optimizer import optimizer_plan, stepped_tensor_sizes
from tuneplan.estimator.wrappers.base import (
    Buckets,
    Gathered,
    NoSyncGradients,
    Resident,
    ShardingWrapper,
    TopLayer,
    WrapperMemory,
    layer_gathered_bytes,
    nccl_bytes,
)
from tuneplan.estimator.wrappers.fp32_gathers import gather_upcast, unsharded_grad_bytes
from tuneplan.estimator.wrappers.fsdp1_adapter_units import adapter_unit_gradient
from tuneplan.estimator.wrappers.fsdp1_bottom import bottom_unit, top_unit
from tuneplan.estimator.wrappers.fsdp1_offload import (
    frozen_layer_copy,
    gathered_shard_transient,
    held_shard_copies,
    root_forward_unshard,
    root_pre_backward_gathered,
)
from tuneplan.estimator.wrappers.fsdp1_root_end import root_unit_end
from tuneplan.estimator.wrappers.fully_shard import (
    bottom_layer_trains,
    fully_shard_terms,
    lower_layers_gathered,
    tail_reduce_scatter,
)
from tuneplan.estimator.wrappers.fully_shard_accumulation import accumulated_backward
from tuneplan.estimator.wrappers.fully_shard_attention import lower_trained_layer, top_layer_attention
from tuneplan.estimator.xp import ceil_div
from tuneplan.specs.load_precision import fsdp_mixed_precision
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.optimizer import OptimizerPlan
    from tuneplan.estimator.run import Run

# Trainers that wrap each LoRA matrix in an FSDP unit of its own: the HF Trainer (transformers
# update_fsdp_plugin_peft sets PEFT's fsdp_auto_wrap_policy: decoder layers, plus every leaf module with a
# trainable weight), and LLaMA-Factory, which trains through it; Answer.AI's fsdp_qlora train.py
# (get_wrapping_policy: decoder layers or leaf modules whose weight requires grad).
PEFT_UNIT_WRAP = ("hf", "llamafactory", "fsdp-qlora")
# Training loops that run every accumulating micro-batch under ``accelerator.no_sync(model)``: transformers'
# Trainer (``_inner_training_loop``: no_sync unless ``sync_each_batch``, DeepSpeed, or the step's last
# micro-batch), and LLaMA-Factory, which trains through it (simulate: FSDP1 on a fake process group).
HF_TRAINER_LOOPS = ("hf", "llamafactory")
# ``Profile.fsdp_flat_params_only``: Answer.AI's fsdp_qlora train.py builds FullyShardedDataParallel with
# ``use_orig_params=False`` (``FSDP(model, ..., use_orig_params=False, ...)`` in fsdp_main). The HF Trainer
# (accelerate's FullyShardedDataParallelPlugin) and LLaMA-Factory through it pass True.


@dataclass(frozen=True)
class ShardedTerms:
    """What FSDP1 and FSDP2 share: the sharded resident terms and the unsharded sizes they gather."""

    resident: Resident
    layer16: int  # one decoder layer unsharded (16-bit, or packed 4/8-bit codes as stored)
    root_unit: bool  # the root unit holds the embeddings, lm_head, final norm (profile.fsdp_root_embeddings)
    root16: int  # the root unit unsharded, 0 when it holds none
    gathered: int  # the current and the prefetched layer plus the root
    layer_grads: int  # the unsharded gradient of the unit being reduce-scattered
    grads: int  # the unsharded gradient bytes of all trainable parameters (reduce dtype)


def sharded_terms(run: Run, optimizer: OptimizerPlan) -> ShardedTerms:
    """The sharded parameters, gradients and optimizer states on each GPU (1/N of each), and the units
    FSDP gathers: the current and the prefetched block unit, unsharded in 16 bits, and the root unit
    (embeddings, lm_head, final norm: what the block-wise auto-wrap leaves to the root), which FSDP does not
    reshard after forward (FSDP1 ``_runtime_utils._post_forward_reshard``: ``not state._is_root``; FSDP2
    only when reshard_after_forward is left to auto, ``_fsdp_state.py``). With MixedPrecision the sharded
    trainable parameters, their gradients and states are fp32."""
    model, setup, params, compute = run.model, run.setup, run.param_plan, run.dtypes.compute
    world_size = setup.world_size
    weights = params.weight_bytes + params.adapter_bytes
    grads = params.trainable_params * params.trainable_bytes
    states, temp = optimizer.states, optimizer.temp
    layer16 = layer_gathered_bytes(run) * gather_upcast(run)
    if setup.fsdp_version == 2 and setup.is_lora:
        # accelerate's fsdp2_prepare_model shards the adapters inside their layer's group (wrap_fsdp2 in
        # simulate/fsdp2.py): a layer's all-gather carries them, in the MixedPrecisionPolicy param dtype or
        # their own (simulate: Mistral-7B fp32 LoRA r128 all-linear, 10.5M adapter elements per layer)
        adapter_bytes = compute if fsdp_mixed_precision(setup, run.profile) else run.dtypes.adapter
        layer16 += ceil_div(params.adapter_params, max(model.n_layers, 1)) * adapter_bytes
    if fsdp_mixed_precision(setup, run.profile) and compute == 2 and params.trainable_bytes == 2:
        weights += params.trainable_params * 2
        grads *= 2
        # the optimizer steps the fp32 shards: states as the optimizer makes them for fp32 parameters
        # (AdamW's zeros_like doubles; Adafactor's fp32 and bitsandbytes' uint8 states do not)
        fp32 = optimizer_plan(run.optimizer, params.trainable_params, 4, params.trainable_tensors,
                              params.largest_trainable_tensor, params.factored_elems,
                              tensor_sizes=stepped_tensor_sizes(setup, params.trainable_params,
                                                              params.trainable_sizes))
        states, temp = fp32.states, fp32.temp
    weights_shard = ceil_div(weights, world_size)
    root_unit = setup.method in run.profile.fsdp_root_embeddings
    root16 = model.params_non_block * compute * gather_upcast(run) if root_unit else 0
    gathered = fsdp_layers_gathered(setup) * layer16 + root16
    grads_shard, states_shard = ceil_div(grads, world_size), ceil_div(states, world_size)
    temp_shard = ceil_div(temp, world_size)
    host = 0
    if setup.offload != "none":
        host += grads_shard + states_shard + (weights_shard if setup.offload == "all" else 0)
        states_shard, grads_shard, temp_shard = 0, 0, 0
        if setup.offload == "all":
            weights_shard = 0
    # the adapters' shards are flat parameters like the rest: on the host with the parameters offloaded
    # (FSDP1 CPUOffload(offload_params=True), FSDP2 CPUOffloadPolicy), counted there in weights_shard
    adapters = 0 if setup.offload == "all" else ceil_div(params.adapter_bytes, world_size)
    resident = Resident(weights=max(weights_shard - adapters, 0), adapters=adapters, states=states_shard,
                        optimizer_temp=temp_shard, gradients=grads_shard, host=host, nccl=nccl_bytes(setup))
    return ShardedTerms(resident=resident, layer16=layer16, root_unit=root_unit, root16=root16,
                        gathered=gathered, layer_grads=fsdp_reduce_scatter_input(run), grads=grads)


class Fsdp(ShardingWrapper):
    """What FSDP1 and FSDP2 share: the sharding, the collectives, and the frameworks with their own model
    code and loops (LitGPT's no_sync accumulation, torchtune), which are not simulated: their reduce-scatter
    input stays counted at every instant."""

    def memory(self, run: Run, optimizer: OptimizerPlan) -> WrapperMemory:
        terms = sharded_terms(run, optimizer)
        if run.profile.model_code != "hf":
            gathered = terms.gathered
            return WrapperMemory(terms.resident, Buckets(persistent=terms.layer_grads),
                                 Gathered(in_layers=gathered, at_loss=gathered, at_forward_end=gathered),
                                 no_sync=no_sync_gradients(run),
                                 notes=self.notes(run.setup))
        return self.simulated_memory(run, terms)

    def notes(self, setup: TrainSetup) -> tuple[str, ...]:
        return ()

    def simulated_memory(self, run: Run, terms: ShardedTerms) -> WrapperMemory:
        raise NotImplementedError


class Fsdp1(Fsdp):
    """FSDP1 (``FullyShardedDataParallel``, flat parameters), as the HF Trainer runs it (simulated)."""

    name = "fsdp1"

    @classmethod
    def applies(cls, setup: TrainSetup) -> bool:
        return setup.fsdp and setup.fsdp_version == 1

    def notes(self, setup: TrainSetup) -> tuple[str, ...]:
        return (f"FSDP FULL_SHARD: params, grads and optimizer states sharded over {setup.world_size} GPUs",)

    def simulated_memory(self, run: Run, terms: ShardedTerms) -> WrapperMemory:
        """The unsharded gradient exists only while its unit is back-propagated and reduce-scattered, not at
        the loss or in the forward. At the loss: the root (kept unsharded) and the last layer, which the
        root's pre-backward hook prefetches (BACKWARD_PRE) before any layer's backward; the forward gathers
        one layer at a time (limit_all_gathers, no forward prefetch)."""
        model, setup = run.model, run.setup
        world_size = setup.world_size
        gathered, at_loss = terms.gathered, terms.layer16 + terms.root16
        # the device copies of host shards a CPU-offloaded unit in the param dtype keeps while unsharded
        # (wrappers/fsdp1_offload.py: pre_unshard's flat_param_to, the original parameters its views)
        held = held_shard_copies(run)
        layers_gathered = gathered - terms.root16
        gathered += held.of(layers_gathered, terms.root16, world_size)
        at_loss += held.of(terms.layer16, terms.root16, world_size)
        # the top layer's end (FSDP1 use_orig_params: each parameter's gradient is a view's gradient; autograd
        # concatenates them into the flat parameter's unsharded gradient, a cat whose inputs and output are
        # live together, before _post_backward_hook reduce-scatters it), while the root's head gradient, made
        # at the loss, waits for the root's post-backward at the very end (simulate: FSDP1, Llama-2-7B)
        head_wait, end = 0, None
        if setup.method == "full" and terms.root_unit:
            grad_bytes = unsharded_grad_bytes(run)
            head_wait = (model.lm_head_params or model.embed_params) * grad_bytes
            no_sync = no_sync_gradients(run) if accumulates_unsharded(run) else None
            end = root_unit_end(run, terms, grad_bytes, terms.root16 + held.of(0, terms.root16, world_size),
                                no_sync)
        buffers = terms.layer_grads
        # PEFT's per-adapter units: the next layer is gathered once the layer's first adapter starts its
        # backward (fsdp_layers_gathered), so two layers are unsharded at its end
        layer_end = transient = 0
        if fsdp_layers_gathered(setup) == 1 and model.n_layers > 1:
            # the next layer being gathered: its shard's copy, held or transient (wrappers/fsdp1_offload.py)
            transient = gathered_shard_transient(run, terms.layer16)
            layer_end = gathered + terms.layer16 + held.of(terms.layer16, 0, world_size) + transient
        buffers_gathered = Gathered(in_layers=gathered, at_loss=at_loss, at_forward_end=at_loss,
                                    bottom_layer_forward=root_forward_unshard(run, terms.root16),
                                    layer_end=layer_end, layer_end_transient=transient,
                                    root_pre_backward=root_pre_backward_gathered(run, terms.root16,
                                                                                 terms.layer16, at_loss))
        # the lowest trained layer, or the one above it (wrappers/fsdp1_bottom.py)
        bottom, missing = bottom_unit(run, buffers, head_wait,
                                      terms.layer16 + held.of(terms.layer16, 0, world_size),
                                      terms.root16 + held.of(0, terms.root16, world_size), terms.grads,
                                      0 if held.layers else frozen_layer_copy(run, terms.layer16))
        buckets = Buckets(in_layers=buffers, missing_at_bottom=missing)
        # PEFT's per-adapter units: one adapter matrix's views' gradient and its cat at a time
        # (fsdp_layers_gathered), the layer's other adapters accumulated or reduce-scattered already
        at_end = 2 * (adapter_unit_gradient(run) if layer_end else buffers) + head_wait
        return WrapperMemory(terms.resident, buckets, buffers_gathered,
                             top_layer=top_unit(run, buffers, at_end, gathered, head_wait, layer_end),
                             bottom_layer=bottom,
                             end_of_backward=end, no_sync=no_sync_gradients(run), notes=self.notes(setup))


class Fsdp2(Fsdp):
    """FSDP2 (``fully_shard``, as accelerate's ``fsdp2_prepare_model`` applies it): its groups' terms are
    ``wrappers/fully_shard.fully_shard_terms``."""

    name = "fsdp2"

    @classmethod
    def applies(cls, setup: TrainSetup) -> bool:
        return setup.fsdp and setup.fsdp_version == 2

    def simulated_memory(self, run: Run, terms: ShardedTerms) -> WrapperMemory:
        model, setup = run.model, run.setup
        layer16, buffers = terms.layer16, terms.layer_grads
        fully_sharded = fully_shard_terms(model, setup, buffers, run.dtypes.compute, terms.grads,
                                          run.param_plan.trainable_params, layer16,
                                          no_sync_gradients(run))
        forward_end = fully_sharded.tail16 + (fully_sharded.tail16 if model.lm_head_params else layer16)
        # a layer's copy-out in the forward (fully_shard_terms): the group before it still has its flat
        # all-gather output; a tied tail is unsharded from the embeddings on
        tied_tail = 0 if model.lm_head_params else fully_sharded.tail16
        first_group = tied_tail or model.embed_params * run.dtypes.compute
        # or, untied, the embeddings' own copy-out: their flat output beside their unsharded parameters
        bottom_forward = max(first_group + 2 * layer16 + tied_tail, fully_sharded.first_copy_out)
        top_forward = 3 * layer16 + tied_tail if model.n_layers > 1 else 0
        # an untied tail's own copy-out, after the top layer's forward
        head_forward = 0 if tied_tail else layer16 + 2 * fully_sharded.tail16
        # the bottom layer's backward beside the prefetched embedding group (an instant of its own)
        bottom_gathered, missing, bottom_copy = fully_sharded.bottom_backward or (0, 0, 0)
        buckets = Buckets(in_layers=fully_sharded.transient, missing_at_bottom=fully_sharded.pending_bottom,
                          missing_at_bottom_layer=missing)
        # after an accumulating micro-batch: one new weight gradient added in place, the groups already
        # reduce-scattered without theirs (wrappers/fully_shard_accumulation.py)
        accumulated = accumulated_backward(model, setup, no_sync_gradients(run), buffers,
                                           run.dtypes.compute, run.param_plan.trainable_params)
        if accumulated is not None:
            buckets = Buckets(in_layers=accumulated.transient + accumulated.pending_head,
                              missing_at_top=accumulated.missing_at_top,
                              missing_at_bottom=accumulated.missing_at_bottom,
                              missing_at_bottom_layer=accumulated.missing_at_bottom_layer)
        top_counted = buffers if accumulated is None else accumulated.transient
        # with two layers the second layer's backward is the top one's: the only reduce-scatter input
        # ``comm_ctx`` holds then is an untied trained tail's (``held_top``), not a layer's
        held = fully_sharded.held_top if model.n_layers == 2 else fully_sharded.held
        # the lower trained layer and its prefetch, each at its own size (fully_shard.lower_layers_gathered)
        lower = lower_layers_gathered(model, setup, layer16)
        return WrapperMemory(terms.resident, buckets,
                             Gathered(in_layers=lower + held,
                                      at_loss=fully_sharded.tail16, at_forward_end=forward_end,
                                      bottom_layer_forward=bottom_forward, top_layer_forward=top_forward,
                                      head_forward=head_forward, bottom_layer_backward=bottom_gathered,
                                      bottom_layer_copy=bottom_copy),
                             top_layer=TopLayer(counted=top_counted, gradients_at_end=top_counted,
                                                gathered=2 * layer16 + fully_sharded.held_top,
                                                keeps_scratch=True, attention_scratch_only=True,
                                                gradients_at_attention=top_layer_attention(
                                                    run, buffers, accumulated is not None)),
                             end_of_backward=fully_sharded.end, no_sync=no_sync_gradients(run),
                             tail_reduce=tail_reduce_scatter(model, setup, run.dtypes.compute, layer16,
                                                             accumulated is not None),
                             bottom_layer_trains=bottom_layer_trains(model, setup),
                             # its attention core's moment (wrappers/fully_shard_attention.py)
                             bottom_layer=lower_trained_layer(run, buffers, lower + held,
                                                              accumulated is not None),
                             notes=(f"FSDP2 fully_shard: each parameter sharded over {setup.world_size} "
                                    "GPUs",))


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


def frozen_weights_get_gradients(run: Run) -> bool:
    """Whether the backward makes a weight gradient for every frozen block weight of a LoRA run: a unit's
    flat parameter that mixes frozen and trainable weights requires grad (the module doc), so the views
    FSDP hands the block's linears require grad too and autograd computes each one's weight gradient
    (the gradient :func:`no_sync_gradients` holds). Not for 4-bit weights, as there."""
    setup = run.setup
    return (setup.fsdp and setup.world_size > 1 and setup.is_lora and setup.method != "qlora"
            and run.profile.fsdp_mixed_unit_grads)


def fsdp_reduce_scatter_input(run: Run) -> int:
    """The unsharded gradient of the unit being reduce-scattered (FSDP1 ``_post_backward_hook``: the flat
    gradient autograd made for the unit, in the reduce dtype, alive until ``reduce_scatter_tensor`` fills the
    new sharded gradient). A frozen unit makes none: in a LoRA run only the adapters' units do, one
    layer's adapters at most."""
    model, setup, params, compute = run.model, run.setup, run.param_plan, run.dtypes.compute
    per_layer = ceil_div(params.trainable_params, max(model.n_layers, 1))
    grad_bytes = unsharded_grad_bytes(run)
    if setup.is_lora and run.profile.fsdp_mixed_unit_grads:
        # one flat parameter per block holding frozen and trainable weights: its gradient covers the
        # whole block (no_sync_gradients)
        return model.largest_layer_params * compute
    if setup.is_lora:
        return per_layer * grad_bytes
    return min(model.largest_layer_params, params.trainable_params) * grad_bytes


def accumulates_unsharded(run: Run) -> bool:
    """Whether the loop runs every accumulating micro-batch under FSDP's ``no_sync`` (the module docstring):
    LitGPT's ``fabric.no_backward_sync``, the HF Trainer's and LLaMA-Factory's ``accelerator.no_sync``, and
    fsdp_qlora's train.py only with CPU offload (``no_sync`` defaults to False; ``fsdp_qlora()`` turns it on
    for ``use_cpu_offload`` with ``gradient_accumulation_steps > 1``): without it each micro-batch
    reduce-scatters and ``_accumulate_sharded_grad`` adds the shard into ``_saved_grad_shard``."""
    profile = run.profile
    return (profile.fsdp_accumulate_unsharded or run.setup.framework in HF_TRAINER_LOOPS
            or (profile.fsdp_accumulate_unsharded_offloaded and run.setup.offload != "none"))


def no_sync_gradients(run: Run) -> NoSyncGradients | None:
    """Per-GPU gradient bytes under the profile's FSDP wrapping (mixed frozen / trainable units, ``no_sync``
    accumulation: the module's docstring); None when the generic sharded model holds."""
    model, setup, profile, dtypes, params = run.model, run.setup, run.profile, run.dtypes, run.param_plan
    world_size = setup.world_size
    hf_loop = setup.framework in HF_TRAINER_LOOPS
    if world_size < 2 or (setup.method == "qlora" and not hf_loop):
        return None
    accumulate_unsharded = accumulates_unsharded(run)
    if not (profile.fsdp_mixed_unit_grads or accumulate_unsharded):
        return None
    if setup.method == "full":
        grad_params, grad_bytes = params.trainable_params, dtypes.trainable
    elif setup.is_lora and profile.fsdp_mixed_unit_grads:
        # every block's flat parameter requires grad: all block weights plus the adapters inside them
        grad_params, grad_bytes = model.params_layers + params.adapter_params, dtypes.frozen_weight
    else:
        grad_params = params.trainable_params
        grad_bytes = dtypes.adapter if setup.is_lora else dtypes.trainable
    unsharded_bytes = grad_bytes
    upcast = fsdp_mixed_precision(setup, profile) and setup.method != "qlora"
    if upcast and (setup.fsdp_version == 2 or hf_loop):
        # accelerate's fsdp2_prepare_model upcasts the trainable parameters to fp32 (no Params4bit in the
        # model): their sharded gradients are fp32; the unsharded ones accumulated under
        # set_requires_gradient_sync(False) stay in the MixedPrecisionPolicy param dtype; under FSDP1 the
        # Trainer's accelerate upcasts them alike, and _post_backward_hook casts each reduce-scattered shard
        # to the fp32 flat parameter's dtype (_cast_grad_to_param_dtype; simulate: FSDP1, Meta-Llama-3-8B)
        grad_bytes, unsharded_bytes = 4, dtypes.compute
    if gather_upcast(run) > 1:
        # train.py's fp32 MixedPrecision: the accumulated unsharded gradients are fp32 (unsharded_grad_bytes)
        unsharded_bytes = unsharded_grad_bytes(run)
    full = grad_params * grad_bytes
    # CPU offload changes only where the shard lives: the unsharded gradient of an accumulating
    # micro-batch stays on the device (FSDP2: FSDPParamGroup.post_backward -> to_accumulated_grad_if_needed;
    # FSDP1: _post_backward_hook returns before any reduce-scatter or
    # _offload_grad when not state._sync_gradients; prepare_gradient_for_backward keeps a .grad of the
    # unpadded unsharded size for autograd to accumulate into), and the step's reduce-scattered shard is
    # copied into the host's _cpu_grad (_post_reduce_grad_callback -> _offload_grad; simulate: FSDP1
    # CPUOffload, Yi-1.5-6B full with gradient accumulation)
    synced = 0 if setup.offload != "none" else ceil_div(full, world_size)
    accumulating = synced
    if setup.grad_accum > 1 and accumulate_unsharded:
        accumulating = grad_params * unsharded_bytes
    return NoSyncGradients(accumulating=accumulating, synced=synced)
