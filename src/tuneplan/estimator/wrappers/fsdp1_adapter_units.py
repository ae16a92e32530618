"""PEFT's per-adapter FSDP1 units: what a layer's end holds of the adapters' gradients."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.fp32_gathers import unsharded_grad_bytes

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def adapter_unit_gradient(run: Run) -> int:
    """The unsharded gradient of PEFT's largest per-adapter FSDP unit (one ``lora_A`` or ``lora_B``
    weight, ``r x max(d_in, d_out)``, in the reduce dtype). Each adapter matrix is a unit of its own
    (transformers' ``fsdp_auto_wrap_policy``, fsdp_qlora train.py's ``get_wrapping_policy``), so its
    ``_post_backward_hook`` runs as soon as that one weight's gradient is made (torch 2.13
    ``_runtime_utils._post_backward_hook``): in a syncing micro-batch it reduce-scatters and frees the
    unsharded gradient (``_reduce_grad``: ``flat_param.grad = None``), in an accumulating one autograd adds
    it into the unit's unsharded ``.grad`` in place. A layer's end therefore holds, beyond the accumulated
    gradients the rows count, one adapter's new gradient and the cat autograd makes of its view's
    (simulate: FSDP1 LLaMA-Factory, Mistral-7B LoRA r128 on every linear, two micro-batches: at the
    layer's end of the syncing one only the two lower layers' accumulated adapter gradients)::

        at_end = 2 x r x max(d_in, d_out) x b_grad"""
    return run.param_plan.largest_trainable_tensor * unsharded_grad_bytes(run)


def next_layer_at_attention_core(run: Run) -> bool:
    """Whether the layer below is gathered when a layer's attention core is back-propagated. With PEFT's
    per-adapter units the layer below is gathered once the layer's first adapter in forward order starts
    its backward (wrappers/fsdp.fsdp_layers_gathered); where no adapter reads the attention's input (q, k,
    v: the adapters on the MLP or the output projection only), that adapter runs after the attention core
    in the forward, so its backward, and the gather, come before the core's backward (simulate: FSDP1
    LLaMA-Factory, Mistral-7B QLoRA on the MLP, eager: both layers' all-gather outputs and host-shard
    copies beside the top layer's ``_softmax_backward_data``)."""
    spec = run.model.layer_groups[-1][0]
    adapted = [m for m in spec.linears if m.name in run.targets]
    return bool(adapted) and not any(m.reads == "attn_in" for m in adapted)
