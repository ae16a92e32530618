"""Parameters by role and dtype: weights, quantized storage, LoRA adapters, what is trainable.

bitsandbytes storage (bitsandbytes/functional.py ``quantize_4bit`` / ``quantize_blockwise``; QLoRA paper
arXiv 2305.14314 section 3):
- 4-bit NF4/FP4: two values per uint8 byte, one fp32 absmax per block of 64 weights;
- double quant: the absmax are themselves quantized to uint8 in blocks of 256 with one fp32 absmax
  per 256 blocks, plus a 256-entry fp32 code table per tensor;
- LLM.int8 (8-bit): int8 weight plus one fp32 scale per output row (``SCB``).
Only ``nn.Linear`` modules inside the blocks are quantized; transformers' ``get_keys_to_not_convert``
keeps lm_head (and tied weights) unquantized, and embeddings / norms are not Linear. Under transformers'
model code, fused routed experts and routers are not ``nn.Linear`` either and stay 16-bit (``bnb_scope``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tuneplan.estimator.bnb_scope import expert_stack_bytes, fused_expert, quantized, sharded_layer_bytes
from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.fused_expert_lora import ExpertStack, expert_stacks
from tuneplan.estimator.lora_bottom_layer import bottom_gradient_free
from tuneplan.estimator.xp import ceil_div
from tuneplan.specs.lora_targets import adapted_targets
from tuneplan.specs.model import Linear, ModelSpec
from tuneplan.specs.profiles import classifier_head_params, get_profile
from tuneplan.specs.setup import TrainSetup

NF4_BLOCK = 64  # bitsandbytes quantize_4bit default blocksize
DQ_BLOCK = 256  # blocksize of the nested (double) quantization of absmax
CODE_TABLE_BYTES = 256 * 4  # fp32 quantization map kept per tensor under double quant
NF4_CODE_BYTES = 16 * 4  # fp32 4-bit code book per quantized tensor


def lora_targets(model: ModelSpec, setup: TrainSetup) -> frozenset[str]:
    """The LoRA targets as the framework's PEFT adapts them: :func:`resolve_targets`, then PEFT's
    conversion of expert names onto transformers 5's fused expert stacks (``fused_expert_lora``)."""
    if not setup.is_lora:
        return frozenset()
    return adapted_targets(model, setup.targets, get_profile(setup.framework).model_code)


def lora_params_of(m: Linear, rank: int) -> int:
    return m.count * rank * (m.d_in + m.d_out)


# hashable, not frozen (read-only by convention): made for every new setup, and a frozen dataclass's
# __init__ sets each field through object.__setattr__
@dataclass(unsafe_hash=True)
class ParamPlan:
    weight_bytes: int  # resident weights (quantized storage counts here)
    quant_meta_bytes: int
    adapter_params: int
    adapter_bytes: int
    trainable_params: int  # including adapters
    trainable_bytes: int  # bytes per trainable param (grads and AdamW states follow it)
    trainable_weight_params: int  # trainable base params (full / freeze)
    autocast_copy_bytes: int  # 16-bit copies autocast makes of fp32 weights and autograd keeps
    trainable_tensors: int  # number of trainable tensors (allocator rounding of states)
    largest_trainable_tensor: int
    factored_elems: int  # Adafactor: rows + cols of each trainable 2-D tensor, numel of 1-D ones (flat_views)
    # The copies still alive once the forward's autocast region has ended (backward): all of them, but under
    # gradient checkpointing only those saved outside the checkpointed layers (the lm_head's). Checkpointed
    # layers save nothing in the first forward, and autocast drops its cast cache when the region exits
    # (simulate: Qwen2.5-7B full + checkpointing, seq 8192: 1.0 GiB live at the loss backward, not 2.75).
    autocast_copy_backward_bytes: int = 0
    largest_layer_bytes: int = 0  # one decoder layer's weights as sharded and gathered (sharded_layer_bytes)
    recompute_cast_bytes: int = 0  # a checkpointed layer's casts, saved again by its recomputation
    # the casts of autocast_copy_bytes the lm_head's and the top layer's own (layer_end_casts.py)
    head_cast_bytes: int = 0
    top_layer_cast_bytes: int = 0
    # (elements of one trainable tensor, how many such tensors): what a per-tensor optimizer rule needs
    # (bitsandbytes keeps 32-bit states for small tensors); the elements add up to trainable_params
    trainable_sizes: tuple[tuple[int, int], ...] = ()


def quant_bytes(numel: int, d_out: int, bits: int, double_quant: bool) -> tuple[int, int]:
    """(storage bytes, metadata bytes) of one quantized weight of ``numel`` elements."""
    if bits == 8:
        return numel, d_out * 4
    blocks = ceil_div(numel, NF4_BLOCK)
    if double_quant:
        meta = blocks + 4 * ceil_div(blocks, DQ_BLOCK) + CODE_TABLE_BYTES + 4
    else:
        meta = 4 * blocks
    # QuantState.code: bitsandbytes keeps the 16-entry fp32 NF4/FP4 code book per weight
    # (functional.get_4bit_type); real Params4bit footprints include it (18944 x 3584: 35,026,180 B).
    meta += NF4_CODE_BYTES
    return ceil_div(numel, 2), meta


@dataclass
class _Tally:
    """The sums :func:`param_plan` builds, layer by layer then over the modules outside the layers (bytes
    unless named params / elems / tensors)."""

    weight: int = 0
    meta: int = 0
    adapter_params: int = 0
    trainable_weight_params: int = 0
    autocast_copy: int = 0
    top_layer_casts: int = 0  # the last layer walked (the top one)'s share of autocast_copy
    tensors: int = 0
    largest_tensor: int = 0
    factored_elems: int = 0
    sizes: Counter[int] = field(default_factory=Counter)  # trainable tensors: elements -> how many


def param_plan(model: ModelSpec, setup: TrainSetup, dtypes: Dtypes, quant_lm_head: bool = False,
               targets: frozenset[str] | None = None) -> ParamPlan:
    """Parameters by role and dtype: the decoder layers (:func:`layer_params`), then the embeddings, lm_head
    and final norm (:func:`non_block_params`), then the adapters' autocast casts.

    weights = sum over linears of (quantized storage | numel x the trained or frozen dtype) + norms +
    non-block params x their dtype; trainable = adapter params (r x (d_in + d_out) per targeted linear) +
    trainable base params; autocast copies = 16-bit casts of fp32 weights autograd keeps (all of them in the
    forward; under gradient checkpointing only the head's at the loss backward, until the head's backward).

    ``quant_lm_head``: the framework quantizes every nn.Linear, the output head included (Lightning
    Fabric's BitsandbytesPrecision with no ignore_modules, as LitGPT uses it), not only the decoder's.
    ``targets``: :func:`lora_targets`, when the caller has them already (a resolved run)."""
    if targets is None:
        targets = lora_targets(model, setup)
    model_code = get_profile(setup.framework).model_code
    tally = _Tally()
    largest_layer = layer_params(tally, model, setup, dtypes, targets, model_code)
    tally.autocast_copy -= bottom_casts_unsaved(model, setup, dtypes, targets)
    layer_copy_mark = tally.autocast_copy  # copies of the decoder layers' weights (checkpointed under GC)
    non_block_params(tally, model, setup, dtypes, quant_lm_head)
    head_copy = tally.autocast_copy - layer_copy_mark
    adapters = tally.adapter_params
    # fp32 adapters under autocast: lora_A / lora_B weights are cast to 16 bits, cached for the forward
    # (leaf tensors that require grad) and saved for the input-gradient matmuls (simulate: 2 B per adapter
    # parameter live at the loss, e.g. 2 MiB on Qwen2.5-0.5B r16 q,v).
    if dtypes.autocast and dtypes.adapter > dtypes.compute:
        tally.autocast_copy += adapters * dtypes.compute
    copy_backward = head_copy if setup.gradient_checkpointing else tally.autocast_copy
    trainable = adapters + tally.trainable_weight_params
    factored = tally.factored_elems
    if flat_views(setup):
        factored = trainable  # Adafactor factors only tensors of >= 2 dims (_get_options: len(shape) >= 2)
    return ParamPlan(weight_bytes=tally.weight, quant_meta_bytes=tally.meta, adapter_params=adapters,
                     adapter_bytes=adapters * dtypes.adapter, trainable_params=trainable,
                     trainable_bytes=dtypes.adapter if setup.is_lora else dtypes.trainable,
                     trainable_weight_params=tally.trainable_weight_params,
                     autocast_copy_bytes=tally.autocast_copy, trainable_tensors=tally.tensors,
                     largest_trainable_tensor=tally.largest_tensor, factored_elems=factored,
                     autocast_copy_backward_bytes=copy_backward, largest_layer_bytes=largest_layer,
                     recompute_cast_bytes=recompute_casts(model, setup, dtypes),
                     head_cast_bytes=head_copy, top_layer_cast_bytes=tally.top_layer_casts,
                     trainable_sizes=tuple(sorted((n, c) for n, c in tally.sizes.items() if n and c)))


def recompute_casts(model: ModelSpec, setup: TrainSetup, dtypes: Dtypes) -> int:
    """Bytes of the 16-bit casts of one checkpointed decoder layer's fp32 linear weights that its
    recomputation saves for the layer's backward: torch.utils.checkpoint reruns the layer's forward under
    the autocast state of the first forward (``_get_autocast_kwargs`` / ``torch.autocast`` around
    ``recompute_fn``), with grad enabled, so each ``linear`` saves its weight's cast until the layer's
    backward frees it: :math:`\\max_{layer} \\sum_m n_m d_{in} d_{out} \\cdot b_{compute}` (simulate:
    fsdp_qlora, Llama-3.1-405B LoRA on q,v under bf16_autocast: the top layer's seven casts live in its
    backward). 0 without checkpointing (:func:`param_plan` counts the casts of the first forward), under
    quantization or with 16-bit weights; transformers' fused expert stacks are not cast
    (bnb_scope.fused_expert)."""
    weight = dtypes.frozen_weight if setup.method == "lora" else dtypes.trainable
    if not (setup.gradient_checkpointing and dtypes.autocast and weight == 4) or setup.quant_bits:
        return 0
    code = get_profile(setup.framework).model_code
    return max(sum(m.count * m.d_in * m.d_out for m in spec.linears if not fused_expert(m, code))
               for spec, _ in model.layer_groups) * dtypes.compute


def recompute_casts_to_first_target(model: ModelSpec, setup: TrainSetup, dtypes: Dtypes,
                                    targets: frozenset[str]) -> int:
    """The part of :func:`recompute_casts` still live when a LoRA layer's first adapter (forward order)
    starts its backward: the casts of the linears the layer runs up to and including its first adapted one,
    whose backward (the one that frees each cast) autograd runs after that adapter's (the node recorded last
    runs first; PEFT's ``lora.Linear.forward`` adds the adapter's output after the base matmul). Where each
    adapter is an FSDP unit of its own (wrappers/fsdp.fsdp_layers_gathered) that is the moment its
    pre-backward hook prefetches the next layer (simulate: fsdp_qlora, Mistral-7B LoRA on the MLP under
    bf16_autocast: q, k, v, o and gate_proj's casts live at the next layer's all-gather)::

        max_layer sum_{m <= first target} n_m d_in d_out b_compute"""
    if not recompute_casts(model, setup, dtypes):
        return 0
    code = get_profile(setup.framework).model_code
    most = 0
    for spec, _ in model.layer_groups:
        total = 0
        for m in spec.linears:
            total += 0 if fused_expert(m, code) else m.count * m.d_in * m.d_out
            if m.name in targets:
                break
        most = max(most, total)
    return most * dtypes.compute


def bottom_casts_unsaved(model: ModelSpec, setup: TrainSetup, dtypes: Dtypes, targets: frozenset[str]) -> int:
    """Bytes of the bottom layer's 16-bit casts of frozen fp32 weights that autograd does not save in a
    LoRA run without checkpointing under autocast: a frozen linear whose input does not require grad
    (lora_bottom_layer.bottom_gradient_free; a target's base layer too, its adapter a separate branch) has
    an output outside the graph, so the matmul records no backward and its uncached cast
    (autocast_mode.cpp ``cached_cast``: only leaves requiring grad are cached) dies after it:
    :math:`\\sum_{m \\in \\text{free}} n_m d_{in} d_{out} \\cdot b_{compute}` (simulate: fsdp_qlora,
    Llama-3.1-70B LoRA on the MLP, bf16_autocast: layer 0 keeps only down_proj's cast)."""
    if (setup.method != "lora" or setup.gradient_checkpointing or setup.quant_bits or not dtypes.autocast
            or dtypes.frozen_weight != 4):
        return 0
    free = bottom_gradient_free(model, targets)
    return sum(m.count * m.d_in * m.d_out for m in model.layer_groups[0][0].linears
               if m.name in free) * dtypes.compute


def layer_params(tally: _Tally, model: ModelSpec, setup: TrainSetup, dtypes: Dtypes,
                 targets: frozenset[str], model_code: str = "hf") -> int:
    """Add the decoder layers to ``tally``: each group's layers once x its count (freeze: one by one, as only
    the last ``freeze_trainable_layers`` train), their linears (:func:`linear_params`) and norms (trained:
    the trainable dtype; frozen: the non-block dtype under quantization, else the frozen weights').
    Returns the largest layer's weights as a sharding wrapper flattens them
    (``bnb_scope.sharded_layer_bytes``). ``model_code``: whose model code runs, which decides the linears
    bitsandbytes quantizes (``bnb_scope.quantized``)."""
    freeze = setup.method == "freeze"
    trainable_layer_from = model.n_layers - setup.freeze_trainable_layers if freeze else 0
    layer_index = largest_layer = 0
    for spec, count in model.layer_groups:
        before = (tally.weight, tally.meta)
        repeats = 1 if freeze else count
        for _ in range(count) if freeze else [None]:
            trainable_layer = setup.method == "full" or (freeze and layer_index >= trainable_layer_from)
            cast_mark = tally.autocast_copy
            for m in spec.linears:
                linear_params(tally, m, repeats, trainable_layer, setup, dtypes, targets,
                              quantized(m, model_code))
            tally.top_layer_casts = (tally.autocast_copy - cast_mark) // repeats
            for stack in expert_stacks(spec, targets, setup.rank):
                stack_params(tally, stack, repeats, dtypes, setup.quant_bits)
            norm_bytes = (dtypes.trainable if trainable_layer
                          else (dtypes.non_block if setup.quant_bits else dtypes.frozen_weight))
            tally.weight += repeats * spec.norm_params * norm_bytes
            if trainable_layer:
                tally.trainable_weight_params += repeats * spec.norm_params
                tally.tensors += repeats * max(spec.n_norms, 1)
                tally.factored_elems += repeats * spec.norm_params
                norm_sizes(tally, model, spec.norm_params, spec.n_norms, repeats)
            layer_index += 1
        stored = sharded_layer_bytes(tally.weight - before[0], tally.meta - before[1], model_code)
        per_layer = stored // (1 if freeze else count)
        largest_layer = max(largest_layer, per_layer)
    return largest_layer


def linear_params(tally: _Tally, m: Linear, repeats: int, trainable_layer: bool, setup: TrainSetup,
                  dtypes: Dtypes, targets: frozenset[str], is_quantized: bool = True) -> None:
    """Add ``repeats`` copies of one linear to ``tally``: quantized storage and metadata, or its weight and
    bias in the trained or frozen dtype (with the 16-bit cast autocast keeps of an fp32 weight), and its
    LoRA adapter when it is a target. Under quantization a module bitsandbytes leaves alone
    (``is_quantized`` false: fused experts, routers) is a frozen weight in the non-quantized dtype."""
    weight_numel = m.count * m.d_in * m.d_out
    bias_numel = m.count * m.d_out if m.bias else 0
    bits = setup.quant_bits  # a property: read once per linear
    frozen = dtypes.non_block if bits else dtypes.frozen_weight
    # transformers' fused experts (never bitsandbytes linears) are not cast by autocast, trained or frozen
    # (bnb_scope.fused_expert)
    uncast = m.role == "expert" and not is_quantized
    if bits and is_quantized:
        storage, metadata = quant_bytes(m.d_in * m.d_out, m.d_out, bits, setup.double_quant)
        tally.weight += repeats * (m.count * storage + bias_numel * dtypes.non_block)
        tally.meta += repeats * m.count * metadata
    elif trainable_layer:
        tally.weight += repeats * (weight_numel + bias_numel) * dtypes.trainable
        tally.trainable_weight_params += repeats * (weight_numel + bias_numel)
        tally.tensors += repeats * (2 if m.bias else 1)
        tally.sizes[weight_numel] += repeats
        if bias_numel:
            tally.sizes[bias_numel] += repeats
        tally.largest_tensor = max(tally.largest_tensor, m.d_in * m.d_out * m.count)
        tally.factored_elems += repeats * m.count * (m.d_in + m.d_out + (m.d_out if m.bias else 0))
        if dtypes.autocast and dtypes.trainable == 4 and not uncast:
            tally.autocast_copy += repeats * weight_numel * dtypes.compute
    else:
        tally.weight += repeats * (weight_numel + bias_numel) * frozen
        if dtypes.autocast and frozen == 4 and not setup.gradient_checkpointing and not uncast:
            # autocast casts a frozen fp32 weight on every forward; the cast is saved for the
            # input-gradient matmul (autocast caches casts only for params requiring grad:
            # autocast_mode.cpp cached_cast), so a checkpointed layer's forward, which saves
            # nothing, frees each cast after its matmul.
            tally.autocast_copy += repeats * weight_numel * dtypes.compute
    if m.name in targets:
        tally.adapter_params += repeats * lora_params_of(m, setup.rank)
        tally.tensors += repeats * 2 * m.count
        tally.sizes[setup.rank * m.d_in] += repeats * m.count  # lora_A
        tally.sizes[m.d_out * setup.rank] += repeats * m.count  # lora_B
        tally.largest_tensor = max(tally.largest_tensor, setup.rank * max(m.d_in, m.d_out))
        tally.factored_elems += repeats * m.count * (m.d_in + m.d_out + 2 * setup.rank)


def stack_params(tally: _Tally, stack: ExpertStack, repeats: int, dtypes: Dtypes,
                 quant_bits: int | None = None) -> None:
    """Add ``repeats`` copies of a fused expert stack's LoRA (PEFT ParamWrapper: lora_A [r E, d_in], lora_B
    [d_out, r E]) to ``tally``; without autocast, fp32 factors on a 16-bit stack are cast to the stack's
    dtype each forward and baddbmm keeps the casts (peft/tuners/lora/layer.py ``get_delta_factors``; under
    autocast :func:`param_plan` counts the same 16-bit casts of every adapter)."""
    width = stack.rank * stack.experts
    tally.adapter_params += repeats * stack.adapter_params
    tally.tensors += repeats * 2
    tally.sizes[width * stack.d_in] += repeats
    tally.sizes[stack.d_out * width] += repeats
    tally.largest_tensor = max(tally.largest_tensor, width * max(stack.d_in, stack.d_out))
    tally.factored_elems += repeats * (2 * width + stack.d_in + stack.d_out)
    stack_bytes = expert_stack_bytes(quant_bits, dtypes)
    if not dtypes.autocast and dtypes.adapter > stack_bytes:
        tally.autocast_copy += repeats * stack.adapter_params * stack_bytes


def non_block_params(tally: _Tally, model: ModelSpec, setup: TrainSetup, dtypes: Dtypes,
                     quant_lm_head: bool) -> None:
    """Add the embeddings, lm_head and final norm to ``tally``: trainable in a full fine-tune (with the
    head's 16-bit autocast cast of fp32 weights), a quantized head when the framework quantizes it, frozen
    otherwise (a frozen fp32 head's cast is saved for the input-gradient matmul)."""
    non_block = model.params_non_block
    bits = setup.quant_bits
    if setup.method == "full":
        tally.weight += non_block * dtypes.trainable
        tally.trainable_weight_params += non_block
        tally.tensors += 3
        for numel in (model.embed_params, model.lm_head_params, model.other_params):
            if numel:
                tally.sizes[numel] += 1
        norm_sizes(tally, model, model.final_norm_params, 1, 1)
        tally.factored_elems += ((model.vocab + model.hidden) * (1 if model.tied_embeddings else 2)
                                 + model.final_norm_params)
        tally.largest_tensor = max(tally.largest_tensor, model.vocab * model.hidden)
        if dtypes.autocast and dtypes.trainable == 4 and model.lm_head_params:
            tally.autocast_copy += model.lm_head_params * dtypes.compute
        elif dtypes.autocast and dtypes.trainable == 4 and model.tied_embeddings:
            tally.autocast_copy += model.vocab * model.hidden * dtypes.compute
    elif bits and quant_lm_head and model.lm_head_params:
        storage, metadata = quant_bytes(model.head_width * model.hidden, model.head_width, bits,
                                        setup.double_quant)
        tally.weight += (non_block - model.lm_head_params) * dtypes.non_block + storage
        tally.meta += metadata
    else:
        tally.weight += non_block * dtypes.non_block
        # A frozen fp32 lm_head under autocast is cast to 16-bit on every forward and the cast is saved
        # for the input-gradient matmul (no autocast cache for params that do not require grad).
        if dtypes.autocast and dtypes.non_block == 4:
            tally.autocast_copy += model.head_width * model.hidden * dtypes.compute


def norm_sizes(tally: _Tally, model: ModelSpec, params: int, n_norms: int, repeats: int) -> None:
    """Add the tensors of ``n_norms`` hidden-width norms holding ``params`` parameters to ``tally.sizes``: a
    weight of ``hidden`` per norm, and a bias of ``hidden`` too for LayerNorm; what is left (Qwen3's q/k
    norms of head_dim, DeepSeek's latent norms) is counted as one tensor (2 x 128 or 512 + 1,536 elements:
    on the same side of bitsandbytes' 4,096-element threshold as its parts)."""
    per_norm = 2 if model.norm_kind == "layer" else 1
    wide = min(n_norms * per_norm, params // model.hidden) if model.hidden else 0
    if wide:
        tally.sizes[model.hidden] += repeats * wide
    if params - wide * model.hidden:
        tally.sizes[params - wide * model.hidden] += repeats


def flat_views(setup: TrainSetup) -> bool:
    """Whether the optimizer sees every trainable parameter as a 1-D view: FSDP1 (FullyShardedDataParallel)
    keeps each unit's parameters in one flat parameter, and with ``use_orig_params=True`` (as the HF Trainer
    and accelerate wrap it) the original parameters are 1-D views of the rank's shard
    (torch/distributed/fsdp/_flat_param.py ``_use_sharded_views``: "the sharded views are 1D"); without it the
    optimizer steps the flat parameters themselves. FSDP2's DTensor parameters keep their shapes."""
    return setup.fsdp and setup.fsdp_version == 1


def trainable_params(model: ModelSpec, setup: TrainSetup, targets: frozenset[str] | None = None) -> int:
    """Parameters the setup trains: every one (full), the last ``freeze_trainable_layers`` layers (freeze),
    or the LoRA matrices r x (d_in + d_out) of every targeted linear, plus PEFT's trainable copy of a
    sequence-classification head (``modules_to_save``: score / classifier). ``targets``: :func:`lora_targets`,
    when the caller has them already (a resolved run)."""
    if setup.method == "full":
        return model.params_total
    if setup.method == "freeze":
        n = min(setup.freeze_trainable_layers, model.n_layers)
        per_layer = model.params_layers // model.n_layers
        return per_layer * n
    if targets is None:
        targets = lora_targets(model, setup)
    total = 0
    for spec, count in model.layer_groups:
        for m in spec.linears:
            if m.name in targets:
                total += count * lora_params_of(m, setup.rank)
        total += count * sum(stack.adapter_params for stack in expert_stacks(spec, targets, setup.rank))
    if setup.num_labels:
        total += classifier_head_params(model, setup.num_labels)
    return total
