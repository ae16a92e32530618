"""What a step's memory does not owe to the micro-batch size or the sequence length, resolved once per run:
the persistent terms (weights, quantization metadata, adapters, optimizer states, workspaces), the
gradients at each instant, what the data-parallel wrapper keeps, and the switches that choose which
instants exist (``instants.instants`` reads them as arithmetic)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuneplan.estimator.activation_terms import BACKWARD_FIXED
from tuneplan.estimator.activations import ActivationTerms, activation_terms
from tuneplan.estimator.bnb_scope import unquantized_note
from tuneplan.estimator.bottom_weight_cast import bottom_weight_cast_applies
from tuneplan.estimator.eager_forward import EagerForward, eager_forward_terms
from tuneplan.estimator.head_gradient import head_gradient_buffered, head_gradient_in_layers
from tuneplan.estimator.layer_end_casts import head_and_top_layer_casts, top_layer_end_casts
from tuneplan.estimator.logits import logits_terms
from tuneplan.estimator.optimizer import OptimizerPlan
from tuneplan.estimator.optimizer_groups import grouped_optimizer_temp
from tuneplan.estimator.overhead import CUBLAS_WORKSPACE
from tuneplan.estimator.peak_candidates import backward_start_leads, step_below_bottom
from tuneplan.estimator.quant_kernels import bnb_backward_dequant, dequant_transient_bytes
from tuneplan.estimator.run import Run
from tuneplan.estimator.weights import recompute_casts_to_first_target
from tuneplan.estimator.wrappers.base import NO_GATHERS, EndOfBackward, WrapperMemory
from tuneplan.estimator.wrappers.fp32_gathers import gather_upcast, gathered_casts
from tuneplan.estimator.wrappers.fully_shard import embedding_output_requires_grad
from tuneplan.estimator.wrappers.zero12_reductions import trained_layers
from tuneplan.estimator.wrappers.zero_terms import partition_optimizer_plan
from tuneplan.estimator.xp import ceil_div
from tuneplan.specs.model import LayerSpec, ModelSpec
from tuneplan.specs.setup import TrainSetup


@dataclass
class MemoryStatics:
    """What does not depend on batch x seq: persistent terms, gradients, optimizer, sharding, and the switches
    that choose which instants exist, resolved once per run so that ``instants.instants`` is arithmetic.
    Read-only by convention, not frozen: a frozen dataclass sets each of its 60-odd fields through
    ``object.__setattr__``, which doubles the cost of making one (every new setup makes one)."""

    optimizer: OptimizerPlan
    wrapped: WrapperMemory  # what the data-parallel wrapper keeps at each instant (run.wrapper.memory)
    common: dict[str, int]  # weights, quant_meta, lora_adapters, optimizer_states, framework
    common_total: int  # sum of ``common``, the persistent part of every instant's total
    grads: int  # gradients once backward has run
    grads_prev: int  # gradients alive through the next forward (accumulation / keep_grads)
    grads_step: int  # gradients the optimizer step sees
    autocast_copies: int  # autocast weight copies through the forward
    autocast_copies_backward: int  # ... and at the loss backward
    head_dequant: int  # a quantized lm_head's dequantized weight, live per chunk
    dequant: int  # the largest quantized linear's dequantization scratch
    # bitsandbytes' dequantized weight in a layer's backward, and what is live with it per token
    backward_dequant: int
    backward_dequant_per_token: int
    # the dequantized weights back-propagated after the next layer's prefetch (wrappers.base.Gathered
    # layer_end): bytes, bytes per token
    layer_end_dequant: tuple[int, int]
    layer_end_casts: int  # the recomputed casts live there (weights.recompute_casts_to_first_target)
    top_layer_end_casts: int  # the saved casts at the top layer's end, no checkpointing (layer_end_casts.py)
    head_top_casts: tuple[int, int]  # the lm_head's and the top layer's saved casts (layer_end_casts.py)
    acts: ActivationTerms  # the saved-activation terms (activations.saved_at)
    # the logits chain's arguments (logits.logits_plan)
    vocab: int
    logit_bytes: int
    hidden: int
    softmax_keeps_input: bool
    softcap: bool  # the model caps its logits with tanh (logits.logits_plan)
    upcast: bool  # the loss runs in fp32 (logits.logits_plan; :func:`logits_terms`)
    # the default chain's bytes per logit element (logits.default_chain); None: another chain
    logits_per_elem: tuple[int, int, int] | None
    holds: bool  # the training loop keeps the last micro-batch's outputs (profile.loop_holds_outputs)
    holds_to_step: bool  # ... through its backward and the step only (profile.loop_holds_outputs_to_step)
    first: bool  # the longest micro-batch runs first (setup.longest_batch_first)
    checkpointed: bool
    n_layers: int
    # the token-embedding gradient's instant (single GPU, no optimizer in backward): None when it has none;
    # True when a buffer is already there (accumulation / keep_grads), so the new gradient is a temporary
    embedding_into_buffer: bool | None
    # gradients with their buffers: earlier micro-batches' (through the forward and the top layer's backward)
    # and all of them (from the bottom layer on), + FSDP's reduce-scatter input while a layer is
    # back-propagated
    earlier_grads: int
    all_grads: int
    earlier_grads_in_layer: int
    all_grads_in_layer: int
    # ZeRO-3 / FSDP parameters gathered at the end of the forward, at the loss and in the layers
    gathered_at_forward_end: int  # FSDP2: the tail group (norm + head) unsharded at the loss
    # FSDP2: unsharded at the bottom layer's, the top layer's and an untied head's copy-out in the forward
    # (0: no instant there)
    gathered_bottom_forward: int
    gathered_top_forward: int
    gathered_head_forward: int
    gathered_head_backward: int  # ZeRO-3: at a trained untied head's backward (0: no instant)
    gathered_at_loss: int
    gathered_root_pre_backward: int  # FSDP1: the root unit and its shard's device copy (0: no instant)
    gathered: int
    gathered_bottom_backward: int  # at the bottom layer's backward (FSDP2's embedding prefetch; 0: none)
    gathered_bottom_copy: int  # of it, the embedding's host shard copied for the prefetch (CPU offload)
    bottom_layer_grads: int  # the gradient bytes then
    gathered_layer_end: int  # at a layer's backward end, beside the prefetched next layer (0: no instant)
    # FSDP2's embedding backward: (gradients held to the end of the backward, buffers) or None
    end_of_backward: EndOfBackward | None
    next_micro_batch: bool  # the instant after the longest micro-batch (longest first, accumulation)
    next_grads: int  # gradients at that instant, buffers included
    step_grads: int  # gradients at the optimizer step, buffers included
    step_temp: int  # the optimizer step's temporaries (0 when it runs in backward)
    base_notes: tuple[str, ...]  # sharding and optimizer notes
    # ZeRO-3, LoRA / QLoRA: gathered once the prefetcher popped the untied head in the forward, and the
    # decoder layers run before it, whether the running layer is past its attention ((0, 0, False): no
    # instant there; wrappers/zero3_head_pop.py)
    gathered_head_popped: tuple[int, int, bool] = (0, 0, False)
    # a trained layer's largest new weight gradient beside its accumulated buffer, while the layer is
    # back-propagated (new_weight_gradient_temp)
    new_grad_temp: int = 0
    recompute_casts: int = 0  # a checkpointed layer's casts its recomputation saves (weights.recompute_casts)
    recompute_casts_bottom: int = 0  # ... beyond the bottom layer's own gradients (bottom_recompute_casts)
    # the bottom layer's own new weight gradients beyond its recomputed casts (bottom_own_gradients)
    bottom_own_grads: int = 0
    # eager attention's softmax in a checkpointed forward (eager_forward.py); None: no such instant
    eager_forward: EagerForward | None = None
    # FSDP2: an untied trained tail group's reduce-scatter before the top layer's backward; None: none
    tail_reduce: EndOfBackward | None = None
    # the wrapper adds or folds rows of its own (:func:`wrapper_adds_rows`); False: instants.memory_at
    # skips them all in one test
    wrapper_rows: bool = True
    # the layers' scratch is their activation gradients and the dequantization scratch alone: no fused expert
    # stack, no new weight gradient beside its buffer, no bitsandbytes backward dequantization (layer_scratch.
    # layer_backward_scratch's other terms; derived from the fields above once per run)
    plain_scratch: bool = field(init=False)
    # backward_start holds more than forward at every shape (:func:`backward_start_leads`)
    backward_start_leads: bool = field(init=False)
    step_below_bottom: bool = field(init=False)  # optimizer_step can never peak (:func:`step_below_bottom`)
    # the head's new gradient meets an accumulated buffer, or is kept through the layers' backward (bytes;
    # head_gradient.py); the bottom layer's weight gradient beside its fp32 copy (bottom_weight_cast.py)
    head_gradient: bool = False
    head_gradient_in_layers: int = 0
    bottom_weight_cast: bool = False

    def __post_init__(self) -> None:
        experts = any(kind[BACKWARD_FIXED] for kind in self.acts.kinds)
        object.__setattr__(self, "plain_scratch",
                           not (experts or self.new_grad_temp or self.backward_dequant))
        object.__setattr__(self, "backward_start_leads", backward_start_leads(self))
        object.__setattr__(self, "step_below_bottom", step_below_bottom(self))


def embedding_into_buffer(setup: TrainSetup, method: str, wrapper_memory: WrapperMemory) -> bool | None:
    """Whether a full fine-tune's embedding gradient lands in an existing buffer (True), in a tensor of its
    own (False), or has no backward instant of its own (None)."""
    # DDP (gradient_as_bucket_view=False) backs the gradients up in its own buckets: autograd makes the
    # embedding's gradient as on one GPU, and the Reducer's autograd hook (torch/csrc/distributed/c10d/
    # reducer.cpp mark_variable_ready_dense) copies ``.grad`` into its bucket view in place
    ddp = setup.world_size > 1 and not (setup.zero or setup.fsdp)
    if method == "full" and (setup.world_size == 1 or ddp) and not setup.optimizer_in_backward:
        return setup.keep_grads or setup.grad_accum > 1
    if method == "full" and wrapper_memory.embedding is not None:
        return False  # ZeRO-1/2: the hooks move each gradient out (estimator/wrappers/zero.py)
    return None


def memory_statics(run: Run) -> MemoryStatics:
    """The shape-independent terms of ``run``, computed once and kept on it (``run.memo["memory"]``)."""
    if (cached := run.memo.get("memory")) is not None:
        return cached  # type: ignore[no-any-return]
    model, setup, profile, dtypes, params = run.model, run.setup, run.profile, run.dtypes, run.param_plan
    # A quantized lm_head dequantizes its whole weight for every chunk of the forward
    head_dequant = (int(profile.dequant_bytes_per_elem * model.head_width * model.hidden)
                    if setup.quant_bits is not None and profile.quantizes_lm_head else 0)
    optimizer = run.stepped_optimizer
    if not setup.zero and not setup.fsdp:
        optimizer = grouped_optimizer_temp(run, optimizer)
    wrapper_memory = run.wrapper.memory(run, optimizer)
    if setup.zero:
        # DeepSpeed steps the run's optimizer on this rank's flat fp32 partition (wrappers/zero.py): its paged
        # states and notes are the partition's (none with offload: DeepSpeed's CPU Adam)
        optimizer = partition_optimizer_plan(run, ceil_div(params.trainable_params, setup.world_size))
    resident, buckets = wrapper_memory.resident, wrapper_memory.buckets
    grads, grads_prev, grads_step = gradient_terms(run, wrapper_memory)
    autocast_copies, autocast_copies_backward = autocast_copy_terms(run)
    common = persistent_terms(run, wrapper_memory)
    acts = activation_terms(model, setup, dtypes, run.layers, gc_offload=profile.gc_offload,
                            quant_saves_input=profile.quant_saves_input,
                            quant_lm_head=profile.quantizes_lm_head)
    backward_dequant, backward_dequant_per_token = bnb_backward_dequant(
        model, setup, profile, dtypes, run.targets, recompute_per_token=acts.recompute_dequant_per_token)
    embedding = embedding_into_buffer(setup, acts.method, wrapper_memory)
    layer_end_dequant, layer_end_casts = layer_end_terms(run, wrapper_memory)
    out = MemoryStatics(
        optimizer=optimizer, wrapped=wrapper_memory, common=common, common_total=sum(common.values()),
        grads=grads, grads_prev=grads_prev, grads_step=grads_step, autocast_copies=autocast_copies,
        autocast_copies_backward=autocast_copies_backward, head_dequant=head_dequant,
        dequant=dequant_transient_bytes(model, setup, profile), backward_dequant=backward_dequant,
        backward_dequant_per_token=backward_dequant_per_token, acts=acts, **logits_terms(run),
        layer_end_dequant=layer_end_dequant, layer_end_casts=layer_end_casts,
        top_layer_end_casts=top_layer_end_casts(run) if wrapper_memory.gathered.layer_end else 0,
        head_top_casts=head_and_top_layer_casts(run),
        holds=profile.loop_holds_outputs, holds_to_step=profile.loop_holds_outputs_to_step,
        first=setup.longest_batch_first,
        checkpointed=bool(setup.gradient_checkpointing), n_layers=max(model.n_layers, 1),
        embedding_into_buffer=embedding,
        earlier_grads=grads_prev + buckets.persistent + buckets.through_forward,
        all_grads=grads + buckets.persistent,
        earlier_grads_in_layer=grads_prev + buckets.persistent + buckets.in_layers - buckets.missing_at_top,
        # near the bottom of the backward some sharded gradients are not made yet (FSDP2)
        all_grads_in_layer=grads + buckets.persistent + buckets.in_layers - buckets.missing_at_bottom,
        gathered_at_forward_end=wrapper_memory.gathered.at_forward_end,
        gathered_bottom_forward=wrapper_memory.gathered.bottom_layer_forward,
        gathered_top_forward=wrapper_memory.gathered.top_layer_forward,
        gathered_head_forward=wrapper_memory.gathered.head_forward,
        gathered_head_popped=wrapper_memory.gathered.head_popped,
        gathered_head_backward=wrapper_memory.gathered.head_backward,
        gathered_at_loss=wrapper_memory.gathered.at_loss,
        gathered_root_pre_backward=wrapper_memory.gathered.root_pre_backward,
        end_of_backward=wrapper_memory.end_of_backward, tail_reduce=wrapper_memory.tail_reduce,
        gathered=wrapper_memory.gathered.in_layers,
        gathered_bottom_backward=wrapper_memory.gathered.bottom_layer_backward,
        gathered_bottom_copy=wrapper_memory.gathered.bottom_layer_copy,
        bottom_layer_grads=grads + buckets.persistent + buckets.in_layers - buckets.missing_at_bottom_layer,
        gathered_layer_end=wrapper_memory.gathered.layer_end,
        next_micro_batch=setup.longest_batch_first and setup.grad_accum > 1,
        next_grads=(wrapper_memory.no_sync.accumulating if wrapper_memory.no_sync is not None else grads)
        + buckets.persistent + buckets.through_forward,
        step_grads=grads_step + buckets.persistent,
        step_temp=0 if setup.optimizer_in_backward else resident.optimizer_temp,
        base_notes=(wrapper_memory.notes + tuple(optimizer.notes)
                    + unquantized_note(model, setup.quant_bits, profile.model_code, dtypes.non_block)),
        new_grad_temp=new_weight_gradient_temp(run, grads_prev),
        recompute_casts=params.recompute_cast_bytes, recompute_casts_bottom=bottom_recompute_casts(run),
        bottom_own_grads=bottom_own_gradients(run, grads_prev),
        eager_forward=eager_forward_terms(run), wrapper_rows=wrapper_adds_rows(wrapper_memory))
    out.head_gradient, out.head_gradient_in_layers = (head_gradient_buffered(run, out),
                                                      head_gradient_in_layers(run, out))
    out.bottom_weight_cast = bottom_weight_cast_applies(run, out)
    run.memo["memory"] = out
    return out


def wrapper_adds_rows(wrapped: WrapperMemory) -> bool:
    """Whether ``wrapped`` adds instants of its own to the step or folds the layers' rows (FSDP, ZeRO;
    instants.gathered_forward_rows, instants.layer_backward_rows, wrapper_rows.py): a layer folded or
    fetched, parameters gathered anywhere, a bucket made by the first gradient hook, reductions in the
    layers or at the backward's end. None of them on one GPU or under DDP."""
    return (wrapped.top_layer is not None or wrapped.bottom_layer is not None
            or wrapped.end_of_backward is not None or wrapped.tail_reduce is not None
            or wrapped.epilogue is not None or bool(wrapped.layers_backward)
            or bool(wrapped.reduction_moments)
            or bool(wrapped.first_hook_bucket) or wrapped.gathered != NO_GATHERS)


def persistent_terms(run: Run, wrapper_memory: WrapperMemory) -> dict[str, int]:
    """The components alive at every instant, by name: the weights, adapters and optimizer states the
    wrapper keeps on this GPU, the quantization metadata (sharded with the parameters where the profile's
    wrapper shards it) and cuBLAS's workspace."""
    setup, resident = run.setup, wrapper_memory.resident
    meta_shards = setup.world_size if run.wrapper.shards_parameters and run.profile.quant_meta_sharded else 1
    return {
        "weights": resident.weights,
        "quant_meta": ceil_div(run.param_plan.quant_meta_bytes, meta_shards),
        "lora_adapters": resident.adapters,
        "optimizer_states": resident.states,
        "framework": CUBLAS_WORKSPACE,
    }


def layer_end_terms(run: Run, wrapper_memory: WrapperMemory) -> tuple[tuple[int, int], int]:
    """What a LoRA layer's end holds beside the next layer its first adapter prefetched (0 where the wrapper
    gathers nothing there): bitsandbytes' dequantized weight with the gradients it makes
    (quant_kernels.bnb_backward_dequant to the first target), and the recomputed casts still live
    (weights.recompute_casts_to_first_target)."""
    if not wrapper_memory.gathered.layer_end:
        return (0, 0), 0
    model, setup, dtypes = run.model, run.setup, run.dtypes
    return (bnb_backward_dequant(model, setup, run.profile, dtypes, run.targets, to_first_target=True),
            recompute_casts_to_first_target(model, setup, dtypes, run.targets))


def bottom_recompute_casts(run: Run) -> int:
    """The recomputed bottom layer's casts (weights.recompute_casts) beyond its own weight gradients: the
    bottom layer's backward row counts the layer's gradients, made as its casts are released (each
    linear's cast is freed by its own backward, which makes the weight's gradient), so the row holds the
    larger of the layer's start (casts, no own gradients) and end (gradients, no casts): :math:`\\max(0, C
    - n_w b_{grad})` with :math:`C = n_w b_{compute}` the casts of the layer's :math:`n_w` weight
    elements; a LoRA run's own gradients are its adapters', so its casts count whole."""
    casts = run.param_plan.recompute_cast_bytes
    if run.setup.method == "lora" or not casts:
        return casts
    return max(0, casts - casts // run.dtypes.compute * run.param_plan.trainable_bytes)


def bottom_own_gradients(run: Run, grads_prev: int) -> int:
    """The bottom layer's own weight gradients, as new tensors, beyond what its recomputed casts already
    release (bottom_recompute_casts): a full fine-tune on one GPU (or a freeze one, whose backward ends at
    its lowest trained layer, every weight of it trained) makes each weight's gradient in the
    backward of the op that saved the activations it reads (``MmBackward0`` frees its saved input as it
    returns the weight's gradient), so the bottom layer's row is the larger of its start (its activations,
    none of its gradients) and its end (its gradients, its activations released):
    :math:`G + T + \\max(0, A + C - n_w b_{grad})` with :math:`n_w` the layer's parameters, :math:`A` its
    activations, :math:`C` its casts. 0 where the gradients already exist as buffers (accumulation,
    keep_grads: AccumulateGrad adds into them) or a wrapper moves them (simulate: Llama-2-13b full fp32 at
    2 layers, checkpointed: the bottom layer's end, all its gradients made, 400 MiB under its start)."""
    setup, model = run.setup, run.model
    # DDP (gradient_as_bucket_view=False) leaves each ``.grad`` a tensor of its own, copied into its
    # bucket by the reducer's hook (simulate/ddp.py): made as on one GPU
    moved = setup.world_size > 1 and run.wrapper.name != "ddp"
    if (setup.method not in ("full", "freeze") or moved or grads_prev
            or setup.optimizer_in_backward or not model.layer_groups):
        return 0
    # freeze (weights.add_layers): the last ``freeze_trainable_layers`` layers train whole; the backward ends
    # at the lowest, unless checkpointing's ``enable_input_require_grads`` (embedding_output_requires_grad)
    # runs it through the frozen layers to layer 0, which makes no gradient
    lowest = max(0, model.n_layers - setup.freeze_trainable_layers) if setup.method == "freeze" else 0
    if lowest and embedding_output_requires_grad(setup):
        return 0
    own = layer_at(model, lowest).params * run.param_plan.trainable_bytes
    return max(0, own - (run.param_plan.recompute_cast_bytes if setup.gradient_checkpointing else 0))


def layer_at(model: ModelSpec, index: int) -> LayerSpec:
    """The ``LayerSpec`` of the decoder layer at ``index`` (from the bottom), read through the groups'
    counts in order."""
    for spec, count in model.layer_groups:
        if index < count:
            return spec
        index -= count
    return model.layer_groups[-1][0]


def autocast_copy_terms(run: Run) -> tuple[int, int]:
    """(autocast's 16-bit weight copies through the forward, those left at the loss backward), per GPU:
    at the loss backward only the casts autograd saved remain (weights.param_plan: under gradient
    checkpointing the layers' casts die with autocast's cache at the end of the forward); a wrapper that
    shards the parameters casts only its shard."""
    params = run.param_plan
    forward, backward = params.autocast_copy_bytes, params.autocast_copy_backward_bytes
    # fp32 gathers under autocast: the casts are of the unsharded weights (wrappers/fp32_gathers.py)
    if run.wrapper.shards_parameters and not (run.setup.fsdp and gather_upcast(run) > 1):
        forward = ceil_div(forward, run.setup.world_size)
        backward = ceil_div(backward, run.setup.world_size)
    # a QLoRA run's fp32-gathered head under fsdp_qlora's autocast (wrappers/fp32_gathers.gathered_casts)
    casts = gathered_casts(run)
    forward, backward = forward + casts, backward + casts
    return forward, backward


def gradient_terms(run: Run, wrapper_memory: WrapperMemory) -> tuple[int, int, int]:
    """(gradients once backward has run, those alive through the next forward, those the optimizer step
    sees), per GPU: an optimizer in backward keeps only the largest tensor's gradient; earlier micro-batches'
    gradients (accumulation) or the previous step's zeroed buffers (keep_grads) stay through the forward;
    under the profile's FSDP wrapping (wrappers/fsdp.no_sync_gradients) accumulating micro-batches keep
    unsharded gradients of whole units and the step sees the reduce-scattered shard; with the longest
    micro-batch first, the peak batch is the run's first: nothing has accumulated yet."""
    setup, params = run.setup, run.param_plan
    grads, no_sync = wrapper_memory.resident.gradients, wrapper_memory.no_sync
    if setup.optimizer_in_backward:
        grads = min(grads, params.largest_trainable_tensor * params.trainable_bytes)
    accumulates = (setup.grad_accum > 1 or setup.keep_grads) and not setup.optimizer_in_backward
    grads_prev = grads if accumulates else 0
    grads_step = grads if wrapper_memory.step_gradients is None else wrapper_memory.step_gradients
    if no_sync is not None:
        grads, grads_step = no_sync.accumulating, no_sync.synced
        grads_prev = no_sync.accumulating if setup.grad_accum > 1 else 0
    if setup.longest_batch_first:
        grads_prev = 0
    return grads, grads_prev, grads_step


def new_weight_gradient_temp(run: Run, grads_prev: int) -> int:
    """Bytes of the largest new weight gradient of a trained layer, live beside the gradient buffer it is
    added into (0 where no buffer is there).

    A linear's backward returns its weight's gradient as a new tensor (``mm``); into a ``.grad`` that already
    exists (a later micro-batch of an accumulation, keep_grads' zeroed buffer; DDP and ZeRO-1 keep
    ``param.grad``, ZeRO-2/3 and FSDP move it out at each hook) AccumulateGrad adds it in place, the new
    gradient live until then (simulate: Llama-2-13b freeze fp32, two micro-batches: down_proj's 5120 x
    13824 fp32 gradient, 283 MB, beside every buffer). transformers 5 keeps a MoE layer's routed experts as
    two 3-D parameters (``*Experts``: ``gate_up_proj`` E x 2f x h, ``down_proj`` E x h x f) that
    ``torch._grouped_mm`` multiplies; its backward returns the whole stack's weight gradient as one
    tensor: :math:`\\max(2 E f h, E f h)` elements (simulate: Qwen3-235B-A22B freeze, 128 x 3072 x 4096 bf16
    = 3 GiB). Other model code's expert layouts (LitGPT, torchtune, Unsloth's patches) are not read here:
    their dense linears only. The trained layers are a freeze run's top ``freeze_trainable_layers``."""
    setup, model = run.setup, run.model
    if (not grads_prev or setup.method not in ("full", "freeze") or setup.fsdp or setup.zero >= 2):
        return 0
    layers = trained_layers(model, setup)
    hf = run.profile.model_code == "hf"
    largest = 0
    for spec in {id(spec): spec for spec in layers}.values():
        dense = [m.d_in * m.d_out for m in spec.linears if m.role != "expert" or not hf]
        experts = [m.count * m.d_in * m.d_out for m in spec.linears if m.role == "expert"]
        stacks = [sum(experts[:-1]), experts[-1]] if hf and experts else []  # gate and up fused, down
        largest = max(largest, *dense, *stacks)
    return largest * run.param_plan.trainable_bytes
