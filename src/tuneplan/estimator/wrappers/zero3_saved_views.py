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
FSDP1 and FSDP2 free an unsharded parameter by ``untyped_storage().resize_(0)`` (FSDP1
``_free_storage``, FSDP2 ``FSDPParam.free_unsharded_param``): a view of a resized storage holds no memory.
"""

from __future__ import annotations

from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

# model types whose decoder linears compute on a view of the weight (bypassing F.linear)
VIEW_LINEAR_MODEL_TYPES = frozenset({"falcon"})


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


def zero3_view_kept(model: ModelSpec, setup: TrainSetup, targets: frozenset[str], layers_kept: int,
                    holds_all: bool) -> int:
    """Weight elements kept alive by saved views beside what ZeRO-3's coordinator holds gathered, from the
    forward of the layers it releases to their backward (the top layer's, the largest instant).

    Without checkpointing: the layers below the ``k`` that ``__params_to_release`` keeps gathered from
    forward to backward (``zero3_layers_kept``; their views share the storage the coordinator still
    holds), none when the prefetcher keeps every parameter with a backward use (``holds_all``):

    .. math:: V = \\sum_{i < L - k} v_i

    with ``v_i`` from :func:`layer_viewed_weights`. With checkpointing the forward saves nothing; the
    recompute runs inside the layer's backward, whose parameters are used again at once (within
    ``stage3_max_reuse_distance``) and not released: the views share the gathered storage. The quantized
    path (bitsandbytes' matmul) saves no view of a 16-bit weight."""
    if (model.model_type not in VIEW_LINEAR_MODEL_TYPES or setup.gradient_checkpointing or holds_all
            or setup.quant_bits is not None or setup.method == "freeze"):
        return 0
    released = max(model.n_layers - layers_kept, 0)
    if not released:
        return 0
    bottom = layer_viewed_weights(model, setup, targets, bottom=True)
    return bottom + (released - 1) * layer_viewed_weights(model, setup, targets, bottom=False)
