"""What ZeRO-3's parameter coordinator keeps gathered, and when its gradient bucket is first reduced, read
from DeepSpeed 0.19.8's stage-3 code (``PartitionedParameterCoordinator``, stage3.py) once the module trace
is complete (from the second step): the layers kept from forward to backward, the prefetcher running ahead
at the loss and through the top layers' backward, and the IPG bucket's first flush (the order in which a
full fine-tune's gradients reach the bucket and its fills: reduce_buckets.py, which ZeRO-1/2 share)."""

from __future__ import annotations

from functools import lru_cache

from tuneplan.estimator.lora_bottom_layer import bottom_gradient_free_params
from tuneplan.estimator.wrappers.fully_shard import embedding_output_requires_grad
from tuneplan.estimator.wrappers.zero3_rounds import cut_rounds
from tuneplan.specs.model import Linear, ModelSpec
from tuneplan.specs.profiles import get_profile
from tuneplan.specs.setup import TrainSetup

DS_MAX_REUSE_DISTANCE = 1_000_000_000  # elements, DeepSpeed default stage3_max_reuse_distance
DS_MAX_LIVE_PARAMETERS = 1_000_000_000  # elements, DeepSpeed default stage3_max_live_parameters
DS_PARAM_PERSISTENCE_THRESHOLD = 100_000  # elements, DeepSpeed default stage3_param_persistence_threshold
DS_NORM_CHUNK = 250_000_000  # elements, stage3.py ``_constant_buffered_norm2`` buffer_size
# modules of a decoder layer that hold no parameter but still run ZeRO-3's fetch hook (each one a prefetch
# opportunity): the layer, its attention, its MLP and the MLP's activation module
HOOKED_CONTAINERS_PER_LAYER = 4
# a LoRA-wrapped linear runs its base layer, dropout, lora_A and lora_B as modules of their own, each with
# the fetch hook (peft/tuners/lora/layer.py ``Linear.forward``): four fetches beyond the linear's own
PEFT_MODULES_PER_TARGET = 4


def zero3_layers_kept(model: ModelSpec, head_params: int) -> int:
    """Decoder layers whose gathered parameters ZeRO-3 keeps from their forward to their backward.

    ``PartitionedParameterCoordinator.__params_to_release`` (DeepSpeed 0.19.8), once the module trace is
    complete (from the second step): a module's parameters are not released if they are used again
    within ``stage3_max_reuse_distance`` elements of parameters in the traced order. After layer ``L-1-k``'s
    forward come the ``k`` layers above it, the output head's forward and backward fetches, and the backward
    of those ``k`` layers before its own: ``2 k P_layer + 2 P_head``. Layers with that under the distance stay
    gathered from forward to backward (what else keeps the top layer: zero3_head_reuse.py)."""
    per_layer = max(model.largest_layer_params, 1)
    room = DS_MAX_REUSE_DISTANCE - 2 * head_params
    if room <= 0:
        return 0
    return min(model.n_layers, -(-room // (2 * per_layer)))


def zero3_kept_params(model: ModelSpec, setup: TrainSetup, head_params: int, targets: frozenset[str]) -> int:
    """Elements of the decoder layers ZeRO-3 keeps gathered from their forward to their backward
    (:func:`zero3_layers_kept` layers of the largest size), less, when the bottom layer is among them in a
    LoRA run without checkpointing, its linears with no backward use (zero3_backward_uses): the reuse
    window of ``__params_to_release`` never meets them again, so they are released after their forward.
    Under ``freeze`` the backward stops at the lowest trained layer (zero3_backward_uses): the frozen layers
    below it are never met again either, at most the trained top ``n`` are kept (simulate: gemma-2b,
    3 layers, 2 trained over 2 GPUs: layer 0 released after its forward, layers 1-2 and the tied head
    gathered at the loss)."""
    from tuneplan.estimator.wrappers.zero3_head_reuse import zero3_leaf_block_kept
    k = zero3_layers_kept(model, head_params)
    if setup.method == "freeze":
        k = min(k, setup.freeze_trainable_layers)
    kept = k * model.largest_layer_params or zero3_leaf_block_kept(model, setup, head_params)
    if k >= model.n_layers and setup.method == "lora" and not setup.gradient_checkpointing:
        kept -= bottom_gradient_free_params(model, targets)
    return kept


def zero3_gathered_ahead(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                         targets: frozenset[str] = frozenset()) -> int:
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
    # a tied head's embedding is AVAILABLE at the loss: no crossing round pops it (zero3_tied_backward.py)
    from tuneplan.estimator.wrappers.zero3_tied_backward import tied_reach_at_loss

    if (layer_fetches(model, targets) * prefetch_bucket < model.largest_layer_params
            or setup.method == "qlora" or tied_embedding_fills_live(model)):
        return 0
    from tuneplan.estimator.wrappers.zero3_loss_crossing import zero3_reach_at_loss

    queued = zero3_backward_uses(model, setup, targets)
    tied = tied_reach_at_loss(model, setup, queued)
    if tied is not None:
        return tied
    return zero3_reach_at_loss(model, setup, targets, prefetch_reach(model, setup, queued))


def layer_fetches(model: ModelSpec, targets: frozenset[str]) -> int:
    """ZeRO-3 fetch hooks a decoder layer runs in its forward, the most over the layer kinds: its linears,
    two norms, the parameterless containers, and PEFT's four modules per LoRA-wrapped linear."""
    return max(len(spec.linears) + 2 + HOOKED_CONTAINERS_PER_LAYER
               + PEFT_MODULES_PER_TARGET * sum(m.name in targets for m in spec.linears)
               for spec, _ in model.layer_groups)


def tied_embedding_fills_live(model: ModelSpec) -> bool:
    """Whether a tied token embedding alone keeps ZeRO-3's prefetcher from running: it reaches
    ``stage3_max_live_parameters`` ``M`` and stays gathered from its forward to the head's.

    ``PartitionedParameterCoordinator`` (DeepSpeed 0.19.8): ``__params_to_release`` keeps a parameter used
    again within ``stage3_max_reuse_distance`` ``D`` elements of the trace; a tied head's forward fetches
    the embedding's weight after the layers, so with ``P_layers < D`` the embedding is never released in
    the forward, nor in the backward (the head's backward, then the layers', then the embedding's).
    ``_fetch_sub_module_impl`` prefetches at most ``min(M - n_available, prefetch_bucket)`` elements:
    with ``E >= M`` held, none, and every layer parameter is fetched by its own module and released after
    it. (simulate: bloomz-7b1, 3 layers, full fine-tune over 2 GPUs: the coordinator's count 1.0276e9, the
    embedding, at every release of the step, 1.0276e9 plus the one linear at each fetch.)"""
    embed = model.embed_params
    if model.lm_head_params or embed < DS_MAX_LIVE_PARAMETERS:
        return False
    return model.params_total - embed < DS_MAX_REUSE_DISTANCE


def zero3_gathered_at_top_forward(model: ModelSpec, setup: TrainSetup) -> int:
    """Parameters (elements) ZeRO-3 holds gathered during the top decoder layer's forward when the untied
    output head alone reaches ``stage3_max_reuse_distance`` (0 otherwise, or with quantized weights).

    ``PartitionedParameterCoordinator`` (DeepSpeed 0.19.8), complete trace: with ``P_head >= D`` no layer
    is kept from its forward to its backward (:func:`zero3_layers_kept`: the head lies between them), so
    each layer is released after its forward; the prefetcher, held at ``stage3_max_live_parameters`` by the
    layer below, pops the top layer's parameters there and, once that layer is released, the head at the
    top layer's first fetch (the next parameter of the trace: norms are persistent). The top layer and the
    head are then gathered together, ``P_layer + P_head``, more than at the loss, where the top layer has
    been released. (simulate: Qwen2.5-72B, 4 layers, LoRA over 8 GPUs: the coordinator's count 2.125e9
    elements through the top layer's forward, 1.2457e9 at the loss.)"""
    head = model.lm_head_params
    if not head or head < DS_MAX_REUSE_DISTANCE or setup.quant_bits is not None:
        return 0
    return model.largest_layer_params + head


def zero3_head_round_first_pass(model: ModelSpec, setup: TrainSetup) -> int:
    """Elements gathered at the final norm's forward of the first pass with a complete trace when the untied
    head alone reaches ``stage3_max_reuse_distance`` (:func:`zero3_gathered_at_top_forward`'s case, where
    the prefetcher cannot run ahead through the whole forward and :func:`zero3_head_round` is not counted).

    The top layer has been released after its forward; the prefetcher popped the head's round at the top
    layer's first fetch, and in that pass the final norm, released by the record pass (zero3_first_pass.py),
    starts it: the round ``[norm, head]`` is coalesced. The norm's fetch waits for it,
    ``AllGatherCoalescedHandle.wait`` gives the head its copy (``torch.cat(partitions)``) and the flat
    buffer stays filed under the head until its own fetch:

    .. math:: G = 2 P_{head} + P_{norm}

    (simulate: Qwen2.5-72B, 3 layers, freeze with checkpointing over 2 GPUs: the 1.2457e9-element flat
    buffer beside the head's copy at ``model.norm`` in the second micro-batch of the first step.)"""
    head, norm = model.lm_head_params, model.final_norm_params
    if not zero3_gathered_at_top_forward(model, setup) or not 0 < norm <= DS_PARAM_PERSISTENCE_THRESHOLD:
        return 0
    return 2 * head + norm


def zero3_gathered_at_embedding(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int) -> int:
    """Parameters (elements) ZeRO-3 holds gathered at the token embedding's forward, the first module with
    parameters, once its prefetcher runs ahead (zero3_gathered_ahead > 0).

    ``PartitionedParameterCoordinator._fetch_sub_module_impl`` (DeepSpeed 0.19.8), complete trace: every
    module's fetch, the parameterless wrappers above the embedding too (``DeepSpeedZeRoOffload`` hooks the
    root and every submodule), prefetches one round from the trace queue (:func:`prefetch_rounds`). The
    first fetch takes the embedding (the trace's first parameter); each later one, the embedding's own
    included, the layers' parameters in forward order. Nothing is released before the embedding's forward
    ends, so all of it is gathered at once; a parameter the queue meets again (its backward use) is already
    available and is popped without counting, so the whole model bounds it. The embedding's fetch waits for
    its round: a coalesced one (the embedding under the bucket, with the layers' first parameters) gives
    each parameter a copy (``AllGatherCoalescedHandle.wait``) and keeps its flat buffer until the round's
    last parameter is fetched, so it is held twice (simulate: bert-large-uncased, 3 layers, freeze over 2
    GPUs: the 5.275e7-element round beside the embedding's copy at its forward)."""
    # the causal-LM or classification model and its base model above the embedding, and PEFT's
    # PeftModel and LoraModel above those (peft/peft_model.py, peft/tuners/lora/model.py)
    wrappers = 2 + (2 if setup.method in ("lora", "qlora") else 0)
    rounds = prefetch_rounds(forward_trace(model), prefetch_bucket)
    waited = sum(rounds[0]) if rounds and len(rounds[0]) > 1 else 0
    return sum(sum(r) for r in rounds[:wrappers + 1]) + waited


def zero3_head_round(model: ModelSpec, prefetch_bucket: int, setup: TrainSetup | None = None,
                     targets: frozenset[str] = frozenset()) -> int:
    """Elements of the all-gather buffer ZeRO-3 still holds beside the gathered parameters when the untied
    output head runs its forward (0 when the head is tied, or what the forward gathers before the head
    reaches ``stage3_max_live_parameters``, where the rounds stop before it: less, in ``setup``, an
    embedding released after its forward (zero3_first_pass.embedding_released_after_forward) before the
    head's round is popped; the head itself may cross the limit, checked before each pop; simulate:
    Meta-Llama-3-8B, 2 layers, LoRA over 2 GPUs: the head's round popped at layer 0's input norm,
    5.2537e8 elements beside the head's copy at the final norm; 3 layers over 8 GPUs, two micro-batches:
    the 5.2534e8-element round [norm, head] popped at layer 0's ``q_proj``, 6.54e8 layer elements
    gathered before it, held beside the head's copy at the final norm of the second micro-batch).

    ``PartitionedParameterCoordinator.__all_gather_params_`` (DeepSpeed 0.19.8) files one coalesced handle
    under every parameter of a round (``__inflight_param_registry[param] = handle``); a fetch pops only its
    own parameters' entries, and ``AllGatherCoalescedHandle.wait`` gives each parameter a copy of its slices
    (``torch.cat(partitions)``) while the handle keeps the flat buffer they were gathered into
    (``self.partitions``). The flat buffer is freed when the last parameter of the round is fetched: the
    head's round began in the top layer, whose parameters were fetched and copied, so until the head's own
    fetch that round is held twice. A head alone in its round is gathered without a copy, except in the
    first pass with a complete trace, which every run makes (the record pass before it released the
    persistent parameters too, zero3_first_pass.py): the final norm, NOT_AVAILABLE,
    starts the head's round, which is coalesced. (simulate: Llama-2-13b and Mistral-7B, 2 layers, LoRA on
    the MLP: the head's 163.93e6-element flat buffer beside its copy at the final norm's forward of the
    second micro-batch, the head gathered alone in the later ones.) With one micro-batch per step that
    pass is the second step's, and ``DeepSpeedZeroOptimizer_Stage3._post_step`` has gathered the
    persistent parameters again: the head alone (simulate: Qwen2.5-7B, 2 layers, LoRA over 2 GPUs: the
    5.4500e8-element head, no norm, popped at layer 0's input norm of the second step)."""
    from tuneplan.estimator.wrappers.zero3_first_pass import embedding_released_after_forward

    lora = setup is not None and setup.method == "lora"
    trace = forward_trace(model, setup.rank if lora and setup is not None else 0, targets)
    released = model.embed_params if setup and embedding_released_after_forward(model, setup) else 0
    # the wrappers' fetches and the embedding's own pop their rounds before ``__release_param`` takes the
    # embedding off ``n_available`` (zero3_bottom_forward); the head is popped while what is gathered
    # before it is under the limit, and may cross it (``numel_prefetching < min(max_live - n_available,
    # prefetch_bucket)`` is checked before each pop)
    wrappers = 4 if setup is not None and setup.method in ("lora", "qlora") else 2
    rounds = prefetch_rounds(trace, prefetch_bucket, (wrappers + 1, released))
    if not model.lm_head_params or sum(map(len, rounds)) < len(trace):
        return 0
    last = rounds[-1]
    if len(last) > 1:
        return sum(last)
    # the norm is NOT_AVAILABLE in the first pass with a complete trace only before any optimizer step:
    # ``DeepSpeedZeroOptimizer_Stage3._post_step`` gathers the persistent parameters again after each
    # step, so with one micro-batch per step that pass (the second step's) finds it gathered
    norm = model.final_norm_params if setup is None or setup.grad_accum > 1 else 0
    return last[0] + norm if 0 < norm <= DS_PARAM_PERSISTENCE_THRESHOLD else 0


@lru_cache(maxsize=256)  # one per frozen spec, rank and targets: every ZeRO-3 formula of a setup replays it
def forward_trace(model: ModelSpec, rank: int = 0, targets: frozenset[str] = frozenset()) -> tuple[int, ...]:
    """The weights (elements) in the order the forward fetches them: the token embedding, each layer's
    linears, the untied head. Norms and biases are left out, thousands of elements against rounds of
    millions: each moves where a round stops by less than itself.

    With a LoRA ``rank``, a targeted linear's ``lora_A`` (``r d_in``) and ``lora_B`` (``d_out r``) when over
    ``stage3_param_persistence_threshold`` (``mark_persistent_parameters`` keeps the smaller ones whole):
    ``lora_B`` after the weight (peft/tuners/lora/layer.py ``Linear.forward``), ``lora_A`` before it. The
    wrapper's forward reads ``lora_A.weight.dtype`` (``_cast_input_dtype``) while the recording pass has it
    partitioned: ``ZeROOrderedDict.__getitem__`` (deepspeed/runtime/zero/parameter_offload.py) registers it
    as an external parameter of the wrapper, which ``construct_parameter_trace_from_module_trace`` then
    lists at the wrapper's fetch, before its ``base_layer``. A round may so end on ``lora_B``, and the
    head's round is then coalesced (:func:`zero3_head_round`)."""
    layers = [n for spec, count in model.layer_groups  # a group's layers are alike: one layer's, repeated
              for n in [e for m in spec.linears for e in linear_entries(m, rank, targets) * m.count] * count]
    return tuple(n for n in [model.embed_params, *layers, model.lm_head_params] if n)


def linear_entries(m: Linear, rank: int, targets: frozenset[str]) -> tuple[int, int, int]:
    """One linear's (``lora_A``, weight, ``lora_B``) elements in the trace (:func:`forward_trace`), 0 for an
    adapter matrix that is absent or under ``stage3_param_persistence_threshold``; a stacked linear
    (``count`` > 1) per instance, without adapters."""
    lora = m.name in targets and m.count == 1
    a, b = (rank * m.d_in, m.d_out * rank) if lora else (0, 0)
    return (a if a > DS_PARAM_PERSISTENCE_THRESHOLD else 0, m.params // m.count,
            b if b > DS_PARAM_PERSISTENCE_THRESHOLD else 0)


def prefetch_rounds(trace: tuple[int, ...] | list[int], prefetch_bucket: int,
                    released: tuple[int, int] = (0, 0)) -> list[list[int]]:
    """The trace cut into the prefetcher's rounds: each fetch pops parameters until it has taken at least
    ``min(stage3_max_live_parameters - n_available, prefetch_bucket)`` elements, the last one overshooting
    (``_fetch_sub_module_impl``, DeepSpeed 0.19.8); ``released``: (rounds, elements) taken off
    ``n_available`` once that many rounds are popped (``__release_param``: the embedding after its
    forward). Cut once per trace (zero3_rounds.cut_rounds); each caller gets its own lists."""
    return [list(r) for r in cut_rounds(tuple(trace), prefetch_bucket, released, DS_MAX_LIVE_PARAMETERS)]


def zero3_backward_uses(model: ModelSpec, setup: TrainSetup, targets: frozenset[str] = frozenset()) -> int:
    """Parameters (elements) the backward fetches again under ZeRO-3: all of them, less, in a LoRA run without
    checkpointing, the frozen embedding and the first layer's frozen projections whose input does not
    require grad (lora_bottom_layer.bottom_gradient_free: no LoRA target upstream of them in the layer;
    simulate: Llama-2-13b, 2 layers, LoRA on the MLP: the attention, gate and up projections of layer 0
    are released after the forward and not fetched again); under ``freeze``, those above the lowest
    trained layer, where the backward stops (simulate: gemma-3-12b, Phi-3-mini freeze runs over 4 and 8
    GPUs), unless checkpointing's ``enable_input_require_grads`` makes the embedding's output require grad
    (fully_shard.embedding_output_requires_grad): the backward then runs through every layer to the
    embedding, which it fetches last (simulate: Qwen2.5-14B and gemma-2b freeze with checkpointing)."""
    if setup.method == "freeze" and not embedding_output_requires_grad(setup):
        # the backward stops at the lowest trained layer: the head (tied: the embedding's weight), the final
        # norm and the trained layers are used again, nothing below them
        return (model.lm_head_params or model.embed_params) + model.final_norm_params + top_layers_params(
            model, min(setup.freeze_trainable_layers, model.n_layers))
    used = model.params_total
    if setup.method == "lora" and not setup.gradient_checkpointing:
        # a tied head's weight is the embedding's: the head's backward fetches it again (simulate: gemma-2b,
        # 4 layers, LoRA on the attention over 4 GPUs: the 5.243e8-element embedding gathered at the loss)
        used -= ((model.embed_params if model.lm_head_params else 0)
                 + bottom_gradient_free_params(model, targets))
    return used


def top_layers_params(model: ModelSpec, k: int) -> int:
    """Parameters (elements) of the top ``k`` decoder layers."""
    total = 0
    for spec, count in reversed(model.layer_groups):
        take = min(count, k)
        total += take * (spec.linear_params + spec.norm_params)
        k -= take
        if k <= 0:
            break
    return total


def zero3_gathered_in_backward(model: ModelSpec, setup: TrainSetup, done: int = 0,
                               targets: frozenset[str] = frozenset()) -> int:
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
    head = (model.lm_head_params or model.embed_params) if setup.method == "freeze" else model.lm_head_params
    return prefetch_reach(model, setup, zero3_backward_uses(model, setup, targets) - head - done)


def prefetch_reach(model: ModelSpec, setup: TrainSetup, queued: int) -> int:
    """Parameters (elements) gathered once the prefetcher has popped what it may of ``queued`` elements of
    parameters still to be used, in trace order.

    ``_fetch_sub_module_impl`` (DeepSpeed 0.19.8) pops while ``numel_prefetching < min(max_live -
    n_available, prefetch_bucket)``: ``n_available`` climbs to ``stage3_max_live_parameters`` ``M`` plus the
    parameter that crosses it. The token embedding is the trace's last use when the backward reaches it
    (a full fine-tune; LoRA with checkpointing, whose ``enable_input_require_grads`` makes the embedding's
    output require grad): when everything before it fits under ``M`` (``queued - E < M``), the round that
    crosses pops the embedding too and all of ``queued`` is gathered. Otherwise a layer's parameter crosses
    (the queue holds layer parameters there), and ``M`` plus the largest of them bounds what is gathered.
    An untied head popped in the forward is not what is left at the loss: the layers' releases after it
    bring ``n_available`` under ``M`` and the prefetcher refills from layer parameters.
    (simulate: Qwen2.5-7B, DeepSeek-R1-Distill-Llama-8B and Mistral-Nemo LoRA layers, the coordinator's
    count at the loss 1.002e9 to 1.070e9 elements, the untied head 5.45e8 popped in the bottom layer.)"""
    tail = model.embed_params if embedding_used_last(model, setup) else 0
    if queued - tail < DS_MAX_LIVE_PARAMETERS:
        return max(queued, 0)
    largest = largest_ds_parameter(model, get_profile(setup.framework).model_code == "hf")
    return min(queued, DS_MAX_LIVE_PARAMETERS + largest)


def largest_ds_parameter(model: ModelSpec, fused: bool = True) -> int:
    """Elements of the largest decoder-layer parameter DeepSpeed partitions, the most a prefetch round can
    overshoot by: a linear's weight, or one of transformers 5's fused routed-expert stacks, each a single
    3-D parameter of the ``*Experts`` module (``gate_up_proj`` [E, 2f, h]: the expert projections reading
    the MLP input, fused; ``down_proj`` [E, h, f]), not one expert's slice of it; ``fused`` false (other
    model code than transformers') keeps the per-expert slice, as the rest of the trace counts it.

    .. math:: p_{max} = \\max(\\max_{\\text{linears}} d_{in} d_{out},\\ E \\sum_{\\text{in}} d_{in} d_{out},\\
              E\\, d_{in} d_{out}|_{\\text{down}})"""
    sizes = [0]
    for spec, _ in model.layer_groups:
        if not fused:
            sizes += [m.params // m.count for m in spec.linears]
            continue
        sizes += [m.params // m.count for m in spec.linears if m.role != "expert"]
        for reads in ("mlp_in", "mlp_mid"):
            sizes.append(sum(m.params for m in spec.linears if m.role == "expert" and m.reads == reads))
    return max(sizes)


def embedding_used_last(model: ModelSpec, setup: TrainSetup) -> bool:
    """Whether the token embedding's backward fetch is the last parameter use of the step: a full
    fine-tune, or LoRA with gradient checkpointing (zero3_backward_uses keeps the embedding there)."""
    return bool(model.embed_params) and (setup.method == "full" or (
        setup.method == "lora" and bool(setup.gradient_checkpointing)) or (
        setup.method == "freeze" and embedding_output_requires_grad(setup)))


def zero3_gathered_at_head_backward(model: ModelSpec, setup: TrainSetup, at_loss: int) -> int:
    """Gathered bytes at a trained untied head's backward: what the loss held, the head among them
    (``release_sub_module`` frees it only after its backward, DeepSpeed 0.19.8); 0 when there is no
    such instant (a tied or frozen head, 4-bit weights)."""
    if setup.method != "full" or not model.lm_head_params or setup.quant_bits is not None:
        return 0
    return at_loss
