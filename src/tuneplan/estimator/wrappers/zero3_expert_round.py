"""What ZeRO-3 holds while it gathers a decoder layer's fused routed experts in the forward.

transformers 5's MoE layers keep their routed experts as one ``*Experts`` module holding the fused 3-D
stacks ``gate_up_proj`` [E, 2f, h] and ``down_proj`` [E, h, f] (and their biases where the model has them)
as direct parameters. ``PartitionedParameterCoordinator._fetch_sub_module_impl`` (DeepSpeed 0.19.8,
runtime/zero/partitioned_param_coordinator.py) fetches a module's direct parameters in one
``__all_gather_params`` call; with more than one parameter, ``all_gather_coalesced``
(runtime/zero/partition_parameters.py) gathers them into one flat buffer (``torch.empty(partition_sz *
world_size)``) and ``AllGatherCoalescedHandle.wait`` gives each parameter its own copy of its slices
(``param.data = torch.cat(partitions)``) while the handle, filed in ``__inflight_param_registry`` under
every parameter of the round, keeps the flat buffer until the last of them is popped. At the last copy
the stacks are held twice. Bitsandbytes leaves the stacks unquantized under QLoRA (``bnb_scope``), so
the module is as large in a 4-bit run as in a 16-bit one: it is the largest round of the forward.

The first forward and backward record the module trace; until it is complete ``release_sub_module``
releases every parameter of a module after its forward (``__params_to_release`` needs the trace), so each
layer's experts are gathered again by their backward fetch. The forward's copy is not freed with them when
``grouped_mm`` saved its transposed view for the input's gradient (``zero3_saved_views``): at the top
layer's backward fetch every layer's forward copy is alive beside the new round, held twice.

With gradient checkpointing the forward saves nothing, but the recomputation inside the layer's backward
does. ``_fetch_sub_module_impl`` attributes the frozen parameters a checkpoint recomputation fetches to the
backward module active then (``update_recompute_parameters``), and that module's backward
``release_sub_module`` releases them. In a decoder layer whose MoE block is not a ZeRO-3 leaf and adds the
shared experts after the routed ones (``DeepseekV3MoE.forward``: ``hidden_states +
self.shared_experts(residuals)``), the first saved tensor unpacked, which starts the recomputation, is the
shared experts' down projection's: the routed experts are released with it, their recomputed copy kept
by ``grouped_mm``'s saved view, and the experts' own backward fetch gathers them again beside it.

In the recording pass the recomputation releases them itself, trained or frozen: its forward post-hook's
``release_sub_module(forward=True)`` releases every parameter of a module while the trace is incomplete
(``__params_to_release`` needs it), so the recomputed copy, kept by the saved view where the experts'
input requires grad, meets the experts' own backward fetch in any MoE block that is not a ZeRO-3 leaf (a
leaf block's recomputation is its backward's fetch). Once the trace is complete the trained stacks' next
use is within ``max_reuse_distance`` and the recomputed copy is used as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.bnb_scope import expert_stack_bytes, quantized
from tuneplan.estimator.wrappers.reduce_buckets import zero3_leaf_moe
from tuneplan.estimator.wrappers.zero3_saved_views import (
    TRANSPOSED_EXPERT_MODEL_TYPES,
    expert_inputs_need_grad,
    expert_viewed_weights,
)

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run
    from tuneplan.specs.model import LayerSpec

# transformers 5.25 models/*/modeling_*.py whose MoE block's forward ends ``hidden_states +
# self.shared_experts(residuals)``, the routed experts first (none is a DeepSpeed leaf module class)
SHARED_AFTER_ROUTED_MODEL_TYPES = frozenset({
    "deepseek_v2", "deepseek_v3", "deepseek_v32", "dots1", "glm4_moe", "glm4_moe_lite", "glm4v_moe",
    "kimi_linear", "exaone_moe", "mistral4", "solar_open", "minicpm5_moe", "nemotron_h"})


def zero3_expert_round_bytes(run: Run) -> int:
    """Bytes gathered while the top decoder layer's experts module is fetched in the forward: its fused
    stacks' flat buffer and the per-parameter copies (module doc), a lower bound of what is gathered then
    (0 without fused experts, under other model code than transformers').

    .. math:: G = 2 \\, b_e \\sum_{\\text{expert stacks}} E\\,(d_{in} d_{out} + d_{out}[\\text{bias}])

    with ``b_e`` the stacks' bytes per element (``bnb_scope.expert_stack_bytes``: the frozen weight dtype,
    fp32 under QLoRA once PEFT's ``prepare_model_for_kbit_training`` upcast them). (simulate:
    Mixtral-8x22B, 4 layers, QLoRA fp4 in fp32 over 4 GPUs: the 2.416e9-element flat buffer beside the
    ``gate_up_proj`` and ``down_proj`` copies at layer 3's MoE block, the step's peak.)

    A ZeRO-3 leaf MoE block (``reduce_buckets.zero3_leaf_moe``) is fetched as one module, every parameter
    under it (``iter_params(recurse=True)``) in the round: its router and shared expert too, their 16-bit
    parameters in the stacks' buffer, a 4-bit shared expert's packed codes in a buffer of their own, held
    twice alike (simulate: Qwen2-57B-A14B, 2 layers, full over 2 GPUs: the 1.982e9-element buffer of the
    experts, router and shared expert at the recording pass's top-layer fetch)."""
    if run.profile.model_code != "hf" or run.setup.zero != 3 or run.setup.world_size < 2:
        return 0
    spec, setup = run.model.layer_groups[-1][0], run.setup
    stacks = sum(m.params for m in spec.linears if m.role == "expert")
    if not stacks:
        return 0
    codes = 0
    if zero3_leaf_moe(run.model, True):
        block = [m for m in spec.linears if m.role in ("router", "shared_expert")]
        packed = [m for m in block if setup.quant_bits and quantized(m, run.profile.model_code)]
        stacks += sum(m.params for m in block if m not in packed)
        codes = sum(m.d_in * m.d_out * m.count for m in packed) * (setup.quant_bits or 16) // 8
    return 2 * stacks * expert_stack_bytes(setup.quant_bits, run.dtypes) + 2 * codes


def zero3_record_pass_top_bytes(run: Run) -> int:
    """Bytes gathered at the top decoder layer's backward fetch of its experts in the trace-recording pass
    (module doc), without checkpointing (with it: :func:`zero3_recompute_top_bytes`): every layer's
    forward copy kept by its saved view (``zero3_saved_views.expert_viewed_weights``: none of a stack PEFT
    adapts, whose grouped_mm saves the parametrized copy) and the top layer's new round held twice; 0 when
    the top layer's experts' input needs no gradient (no backward fetch) or :func:`zero3_expert_round_bytes`
    is 0.

    .. math:: G = b_e \\left(\\sum_i v_i + 2 S_{top}\\right)

    (simulate: Mixtral-8x22B, 2 layers, QLoRA fp4 in fp16 over 4 GPUs without checkpointing: both layers'
    ``gate_up_proj`` / ``down_proj`` copies from the first forward beside the top layer's 2.416e9-element
    flat buffer and its copies, the first micro-batch's backward the step's peak.)"""
    round_bytes = zero3_expert_round_bytes(run)
    if not round_bytes:
        return 0
    if run.setup.gradient_checkpointing:
        return zero3_recompute_top_bytes(run)
    viewed = expert_viewed_weights(run.model, run.setup, run.targets)
    if not viewed or not expert_inputs_need_grad(run.model, run.setup, run.targets)[-1]:
        return 0
    return sum(viewed) * expert_stack_bytes(run.setup.quant_bits, run.dtypes) + round_bytes


def zero3_recompute_top_bytes(run: Run) -> int:
    """Bytes gathered at the top decoder layer's backward fetch of its experts under checkpointing (module
    doc): in every pass where the recomputed frozen stacks are attributed to the shared experts' backward
    (:func:`zero3_recompute_every_pass`), else in the recording pass.

    .. math:: G = 3\\, b_e\\, S_{top} \\quad\\text{(every pass)}, \\qquad
              G = b_e\\, v_{top} + 2\\, b_e\\, S_{top} \\quad\\text{(recording pass)}

    with ``S_top`` the stacks of the highest layer whose frozen weights are recomputed
    (:func:`frozen_recomputed_layer`: the top one, or under freeze the one below the trained ones),
    ``v_top`` the top layer's stacks whose recomputed copy the saved view keeps
    (``zero3_saved_views.expert_viewed_weights``: 0 when the experts' input needs no gradient, none of a
    stack PEFT adapts). (simulate: DeepSeek-V3, 3 layers, freeze over 2 GPUs under checkpointing: layer 5's
    recomputed 1.127e10-element ``gate_up_proj`` / ``down_proj`` beside the backward fetch's flat buffer
    and its copies, the first micro-batch's peak, 107.3 GB.)"""
    model, setup = run.model, run.setup
    if zero3_recompute_every_pass(run):
        spec = frozen_recomputed_layer(run)
        stacks = sum(m.params for m in spec.linears if m.role == "expert") if spec is not None else 0
        return 3 * stacks * expert_stack_bytes(setup.quant_bits, run.dtypes)
    if zero3_leaf_moe(model, True):
        return 0
    viewed = expert_viewed_weights(model, setup, run.targets)[-1]
    if not viewed:
        return 0
    return viewed * expert_stack_bytes(setup.quant_bits, run.dtypes) + zero3_expert_round_bytes(run)


def zero3_recompute_every_pass(run: Run) -> bool:
    """Whether the highest back-propagated layer with frozen stacks (:func:`frozen_recomputed_layer`) has its
    recomputed experts released before their backward fetch in every pass, not only in the recording one
    (module doc): ``update_recompute_parameters`` files them (frozen weights only: ``not
    param.requires_grad`` in ``_fetch_sub_module_impl``) under the shared experts' backward module, which
    runs first where the model's MoE block adds its shared experts after the routed ones
    (:data:`SHARED_AFTER_ROUTED_MODEL_TYPES`, not a leaf module)."""
    model, setup = run.model, run.setup
    if (not setup.gradient_checkpointing or model.model_type not in SHARED_AFTER_ROUTED_MODEL_TYPES
            or model.model_type in TRANSPOSED_EXPERT_MODEL_TYPES):
        return False
    spec = frozen_recomputed_layer(run)
    return (spec is not None and any(m.role == "expert" for m in spec.linears)
            and any(m.role == "shared_expert" for m in spec.linears))


def frozen_recomputed_layer(run: Run) -> LayerSpec | None:
    """The highest decoder layer whose frozen weights a checkpoint's recompute fetches and whose backward
    runs, under checkpointing: the top one under LoRA / QLoRA (PEFT's ``enable_input_require_grads`` makes
    every layer's input require grad, the stacks frozen); under freeze the one below the top
    ``freeze_trainable_layers`` (transformers' ``_activation_checkpointing_enable`` calls
    ``enable_input_require_grads`` for a model whose ``main_input_name`` is ``input_ids``, so the frozen
    layers are back-propagated too); None otherwise."""
    model, setup = run.model, run.setup
    if setup.method in ("lora", "qlora"):
        return model.layer_groups[-1][0]
    if setup.method != "freeze":
        return None
    layers = [spec for spec, count in model.layer_groups for _ in range(count)]
    below = len(layers) - min(setup.freeze_trainable_layers, len(layers)) - 1
    return layers[below] if below >= 0 else None
