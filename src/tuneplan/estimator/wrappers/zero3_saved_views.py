"""Gathered ZeRO-3 weights that autograd keeps alive through a saved view after DeepSpeed releases them.

DeepSpeed 0.19.8 releases a gathered parameter by replacing its data (partition_parameters.py
``free_param``: ``param.data = torch.empty(0, ...)``), not by resizing its storage: a tensor that still
views the gathered storage keeps it allocated. ``nn.Linear`` is safe under the HF Trainer: ZeRO-3's
``zero.Init`` (``_enable_mem_efficient_linear``) replaces ``torch.nn.functional.linear`` by
``zero3_linear_wrap``, whose ``LinearFunctionForZeroStage3`` saves the parameter itself. transformers'
``FalconLinear.forward`` (models/falcon/modeling_falcon.py) computes ``input @ self.weight.T`` instead:
the matmul saves the ``weight.T`` view for the input's gradient whenever the input requires grad, so the
gathered weight lives from the linear's forward to its backward, and the backward's fetch gathers a second
copy beside it. GPT-2's ``Conv1D`` (``torch.addmm(bias, x, self.weight)``) saves the parameter, not a view.
transformers' fused MoE experts (``use_experts_implementation``, integrations/moe.py; the default
``grouped_mm`` path, ``_grouped_linear``) multiply ``weight.transpose(-2, -1)``, a view of the whole 3-D
``gate_up_proj`` / ``down_proj`` stack, which ``_grouped_mm`` saves for the input's gradient; the eager loop
(``F.linear(x, self.gate_up_proj[idx])``, ``zero3_linear_wrap``) saves an indexed view of it as well.
Experts stored transposed (``is_transposed=True``) are multiplied as the parameter itself: no view.
FSDP1 and FSDP2 free an unsharded parameter by ``untyped_storage().resize_(0)`` (FSDP1
``_free_storage``, FSDP2 ``FSDPParam.free_unsharded_param``): a view of a resized storage holds no memory.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tuneplan.estimator.fused_expert_lora import expert_stacks
from tuneplan.estimator.wrappers.base import WrapperMemory
from tuneplan.estimator.wrappers.zero3_coordinator import (
    DS_MAX_LIVE_PARAMETERS,
    zero3_backward_uses,
    zero3_gathered_ahead,
    zero3_layers_kept,
)
from tuneplan.estimator.wrappers.zero3_head_reuse import zero3_leaf_block_kept, zero3_recorded_unreleased
from tuneplan.estimator.wrappers.zero_terms import DS_PREFETCH_BUCKET
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run

# model types whose decoder linears compute on a view of the weight (bypassing F.linear)
VIEW_LINEAR_MODEL_TYPES = frozenset({"falcon"})
# MoE model types whose fused experts are declared ``use_experts_implementation(is_transposed=True)``
# (transformers 5.25 models/*/modeling_*.py): ``_grouped_linear`` multiplies the parameter, not a view
TRANSPOSED_EXPERT_MODEL_TYPES = frozenset({"gpt_oss", "aria", "ergo", "openai_privacy_filter"})


def layer_viewed_weights(model: ModelSpec, setup: TrainSetup, targets: frozenset[str],
                         bottom: bool) -> int:
    """Weight elements of one decoder layer whose ``weight.T`` view its forward saves (0 unless the model's
    linears compute on a view).

    A view is saved only when the linear's input requires grad (the weight is frozen under LoRA and
    freeze; a full fine-tune saves every one). In the bottom layer of a LoRA run without checkpointing
    nothing below requires grad (the embedding is frozen and no ``enable_input_require_grads``): the
    linears reading the layer's normed input do not save (Falcon's parallel attention: the query-key-value
    and the MLP's up projection, ``FalconDecoderLayer.forward``), and the one after each saves only when
    a LoRA target upstream makes its input require grad."""
    if model.model_type not in VIEW_LINEAR_MODEL_TYPES:
        return 0
    spec = model.layer_groups[0][0] if bottom else model.layer_groups[-1][0]
    lora_bottom = bottom and setup.method in ("lora", "qlora") and not setup.gradient_checkpointing
    total = 0
    for m in spec.linears:
        if lora_bottom:
            if m.reads in ("attn_in", "mlp_in"):
                continue
            branch = "attn_in" if m.role == "attn" else "mlp_in"
            if not any(u.name in targets and u.reads == branch for u in spec.linears):
                continue
        total += m.params
    return total


def zero3_views_kept(run: Run, head: int, prefetch_bucket: int) -> int:
    """Elements of released gathered weights kept by saved views (:func:`zero3_view_kept`): none when
    the prefetcher holds every parameter with a backward use from the forward on."""
    model, setup = run.model, run.setup
    ahead = zero3_gathered_ahead(model, setup, prefetch_bucket, run.targets)
    holds_all = bool(ahead) and ahead >= zero3_backward_uses(model, setup, run.targets)
    if holds_all:
        return zero3_bottom_views_regathered(model, setup, run.targets)
    # a kept leaf MoE block is the top layer's viewed weights: gathered, not released (zero3_head_reuse)
    kept = zero3_layers_kept(model, head) or int(zero3_leaf_block_kept(model, setup, head) > 0)
    views = zero3_view_kept(model, setup, run.targets, kept, holds_all)
    # the top layer's weights the prefetcher recorded while gathered are never released (zero3_head_reuse)
    return max(views - zero3_recorded_unreleased(model, setup, run.targets, head, kept), 0) if views else 0


def zero3_view_kept(model: ModelSpec, setup: TrainSetup, targets: frozenset[str], layers_kept: int,
                    holds_all: bool) -> int:
    """Weight elements kept alive by saved views beside what ZeRO-3's coordinator holds gathered, from the
    forward of the layers it releases to their backward (the top layer's, the largest instant).

    Without checkpointing: the layers below the ``k`` that ``__params_to_release`` keeps gathered from
    forward to backward (``zero3_layers_kept``; their views share the storage the coordinator still
    holds), none when the prefetcher keeps every parameter with a backward use (``holds_all``):

    .. math:: V = \\sum_{i < L - k} v_i

    with ``v_i`` from :func:`layer_viewed_weights` plus the fused expert stacks of
    :func:`expert_viewed_weights` (under QLoRA too: bitsandbytes leaves the fused 3-D experts 16-bit,
    ``bnb_scope``). With checkpointing the forward saves nothing; the
    recompute runs inside the layer's backward, whose parameters are used again at once (within
    ``stage3_max_reuse_distance``) and not released: the views share the gathered storage. The quantized
    path (bitsandbytes' matmul) saves no view of a 16-bit weight."""
    if setup.gradient_checkpointing or holds_all:
        return 0
    released = max(model.n_layers - layers_kept, 0)
    if not released:
        return 0
    # fused experts are not quantized under QLoRA either (estimator/bnb_scope.py): same saved view
    experts = sum(expert_viewed_weights(model, setup, targets)[:released])
    if (model.model_type not in VIEW_LINEAR_MODEL_TYPES or setup.quant_bits is not None
            or setup.method == "freeze"):
        return experts
    bottom = layer_viewed_weights(model, setup, targets, bottom=True)
    return experts + bottom + (released - 1) * layer_viewed_weights(model, setup, targets, bottom=False)


def expert_viewed_weights(model: ModelSpec, setup: TrainSetup, targets: frozenset[str]) -> list[int]:
    """Per decoder layer, bottom first: the fused routed-expert elements whose view its forward saves.

    The view is saved when the experts' input (the layer's normed MLP input) requires grad: every layer
    of a full fine-tune (the embedding is trained); under freeze the trainable top ``n`` layers (their
    attention's weights require grad) and none below; under LoRA every layer above the bottom one when
    some module is a target, and the bottom one (no checkpointing, no ``enable_input_require_grads``)
    only when one of its attention linears is a target (:func:`expert_inputs_need_grad`).

    A stack PEFT adapts (``lora.ParamWrapper``, ``fused_expert_lora``) saves no view of the gathered
    parameter: ``ParamWrapper._activate_lora`` (peft/tuners/lora/layer.py) registers a parametrization,
    ``_LoraFactorsProxy.forward`` (``torch.baddbmm(W, lhs, rhs)``; ``_LoraParameterProxy``: ``W +
    delta_weight``) returns a new tensor the size of the stack, and ``_grouped_mm`` saves the transposed
    view of that new tensor (counted with the layer's activations, ``layer_saved``); baddbmm's backward needs
    its factors, not ``W``. Once DeepSpeed releases the gathered parameter nothing keeps its storage:

    .. math:: v_i = [\\text{input}_i \\text{ requires grad}] \\sum_{\\text{unadapted expert stacks}}
              E\\,d_{in} d_{out}
    """
    layers = [spec for spec, count in model.layer_groups for _ in range(count)]
    if model.model_type in TRANSPOSED_EXPERT_MODEL_TYPES:
        return [0] * len(layers)
    out = []
    for spec, grad in zip(layers, expert_inputs_need_grad(model, setup, targets), strict=True):
        stacks = sum(m.params for m in spec.linears if m.role == "expert")
        # the rank does not enter the adapted stacks' weight sizes
        adapted = sum(s.weight_numel for s in expert_stacks(spec, targets, 1))
        out.append(stacks - adapted if grad else 0)
    return out


def expert_inputs_need_grad(model: ModelSpec, setup: TrainSetup, targets: frozenset[str]) -> list[bool]:
    """Per decoder layer, bottom first: whether its routed experts' input (the layer's normed MLP input)
    requires grad: every layer of a full fine-tune (the embedding is trained); under freeze the trainable
    top ``n`` layers; under LoRA every layer above the bottom one when some module is a target, and the
    bottom one (no checkpointing, no ``enable_input_require_grads``) only when one of its attention linears
    is a target."""
    layers = [spec for spec, count in model.layer_groups for _ in range(count)]
    out = []
    for i in range(len(layers)):
        if setup.method == "freeze":
            grad = i >= len(layers) - setup.freeze_trainable_layers
        elif setup.method in ("lora", "qlora"):
            bottom_attn = any(m.name in targets for m in layers[0].linears if m.role == "attn")
            grad = bottom_attn if i == 0 else bool(targets)
        else:
            grad = True
        out.append(grad)
    return out


def zero3_bottom_views_regathered(model: ModelSpec, setup: TrainSetup, targets: frozenset[str]) -> int:
    """Elements kept by the bottom layer's saved views beside what the coordinator holds at the loss when
    the prefetcher holds every parameter with a backward use there, but reached the bottom layer's backward
    uses only after that layer's forward (0 otherwise).

    ``_fetch_sub_module_impl`` (DeepSpeed 0.19.8) pops while ``numel_prefetching < M - n_available``:
    through the forward it holds the embedding and the layers ahead, and when those reach
    ``stage3_max_live_parameters`` ``M`` it stalls before the backward's entries, the bottom layer's last
    (the layers above are AVAILABLE, skipped uncounted). ``__params_to_release`` then releases each bottom
    linear after its forward (no later use popped yet); its saved ``weight.T`` view
    (:func:`layer_viewed_weights`) keeps that storage, and the release lowering ``n_available`` lets the
    prefetcher pop the linear's backward use at once: a second gathered copy. With several micro-batches a
    step the first complete pass follows a record pass that released the persistent parameters
    (zero3_first_pass.py): the forward's persistent tail the stalled prefetcher left (the top layer's small
    LoRA factors, the final norm) joins that round, coalesced, and its flat buffer stays filed under the
    bottom linear until its backward fetch (``AllGatherCoalescedHandle.wait``'s copy beside it):

    .. math:: V = v_0\\,(1 + [\\text{accumulation}]), \\quad E + \\sum_i P_i \\ge M

    (simulate: falcon-7b, 4 layers, LoRA on the MLP, two micro-batches over 8 GPUs: at the loss the
    bottom ``dense_4h_to_h``'s 8.259e7 released copy, its regathered copy and the 8.267e7-element flat
    buffer of ``[top dense_4h_to_h.lora_B, dense_4h_to_h, ln_f]`` popped at its ``lora_dropout``.)"""
    if setup.gradient_checkpointing or setup.quant_bits is not None or setup.method == "freeze":
        return 0
    layers = sum((spec.linear_params + spec.norm_params) * count for spec, count in model.layer_groups)
    if model.embed_params + layers < DS_MAX_LIVE_PARAMETERS:
        return 0  # the prefetcher passes the bottom layer's backward uses before its forward
    viewed = layer_viewed_weights(model, setup, targets, bottom=True)
    return viewed * (2 if setup.grad_accum > 1 else 1)


def zero3_views_below_top(run: Run, head: int, prefetch_bucket: int) -> int:
    """Elements kept by saved views while the top decoder layer runs its forward: the released weights of
    the layers below it (:func:`zero3_view_kept` with the top layer left out, its weights gathered in its
    own round), from their forward on:

    .. math:: V_{top} = \\sum_{i < L - \\max(k, 1)} v_i

    (simulate: Qwen2-57B-A14B, 3 layers, full without checkpointing over 4 GPUs: layers 0 and 1's
    ``gate_up_proj`` / ``down_proj`` copies, 2 x 1.7616e9 elements, live beside layer 2's expert rounds
    at the step's peak in its MoE block.)"""
    model, setup = run.model, run.setup
    ahead = zero3_gathered_ahead(model, setup, prefetch_bucket, run.targets)
    if ahead and ahead >= zero3_backward_uses(model, setup, run.targets):
        return 0
    kept = zero3_layers_kept(model, head) or int(zero3_leaf_block_kept(model, setup, head) > 0)
    return zero3_view_kept(model, setup, run.targets, max(kept, 1), False)


def with_views_at_top_forward(run: Run, memory: WrapperMemory) -> WrapperMemory:
    """``memory`` with :func:`zero3_views_below_top` added to the top layer's forward row where it has
    one."""
    g = memory.gathered
    if not g.top_layer_forward:
        return memory
    head = run.model.lm_head_params or run.model.embed_params
    bucket = run.setup.ds_prefetch_bucket or DS_PREFETCH_BUCKET
    below = zero3_views_below_top(run, head, bucket) * run.dtypes.compute
    return replace(memory, gathered=replace(g, top_layer_forward=g.top_layer_forward + below))
