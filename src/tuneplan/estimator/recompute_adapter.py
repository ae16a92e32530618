"""The recomputed layer's last LoRA adapter in its forward: the transients live beside the layer's
recomputation and the backward's incoming gradient.

Under gradient checkpointing a layer is run forward again inside the backward (torch utils/checkpoint.py,
non-reentrant: the recomputation runs when its first saved tensor is unpacked), with the gradient of the
layer's output already live. PEFT's LoRA forward (peft tuners/lora/layer.py ``Linear.forward``) is::

    result = self.base_layer(x)
    x = self._cast_input_dtype(x, lora_A.weight.dtype)   # a copy when the adapter is wider (fp32)
    result = result + lora_B(lora_A(dropout(x))) * scaling

so while the last adapter L (forward order: the down projection) runs lora_A, alive and not saved are: L's
input itself when nothing saves it (a frozen base keeps no input), its cast to the adapter dtype, the
dropout's output (in that dtype) and the base layer's output; the layer's saved tensors are all there.
Per token, with :math:`a` the adapter's bytes, :math:`i` the input's, :math:`o` the output's::

    temp = i d_in [unsaved] + a d_in [cast] + a' d_in [dropout] + o d_out + residual_b n h

(simulate: fsdp_qlora profile on one GPU, Mistral-7B LoRA bf16-mixed with fp32 adapters, dropout 0.05,
checkpointed: the peak at the top layer's down_proj lora_A ``mm`` in the backward, the fp32 cast and the
fp32 dropout output of the 14336-wide product beside it). PEFT's bitsandbytes layers do not cast under
autocast (bnb.py ``requires_conversion``). FSDP2 (``fully_shard`` on whole decoder layers, adapters inside
their layer's group: wrappers/fsdp.py ``Fsdp2``) runs the same recomputation: the pre-backward hook
all-gathers the layer, then checkpoint's unpack hook replays its forward, PEFT's cast and dropout included
(simulate: falcon-40b 3 layers LoRA fsdp2 ws4, LLaMA-Factory fp16, b3 x 2048: the peak at the top layer's
``dense_4h_to_h`` lora_A ``mm`` in the backward, its fp32 cast and fp32 dropout output of the 32768-wide
GELU output beside it). FSDP1 and ZeRO runs are left to their wrappers' rows."""

from __future__ import annotations

from tuneplan.estimator.layer_walk import LayerWalk
from tuneplan.estimator.lora_bottom_layer import parallel_block


def recompute_adapter_temp(walk: LayerWalk, residual_grads: int) -> float:
    """Bytes per token of the transients at the recomputed layer's last adapter's lora_A (module docstring),
    0 without checkpointing, without an adapter, or under FSDP1 / ZeRO (their wrappers' rows)."""
    setup, dtypes = walk.setup, walk.dtypes
    if (not setup.gradient_checkpointing or walk.last_target is None or setup.zero
            or (setup.fsdp and setup.fsdp_version != 2)):
        return 0.0
    _, name, reads = walk.last_target
    linear = walk.spec.by_name.get(name)
    if linear is None or linear.role != "mlp":
        return 0.0
    input_bytes = walk.inputs_dtype.get(reads, walk.compute_bytes)
    cast = dtypes.adapter != input_bytes and not (walk.quantized and dtypes.autocast)
    temp = 0.0 if reads in walk.ledger.items else float(input_bytes * linear.d_in)
    if cast:
        temp += dtypes.adapter * linear.d_in
    if (setup.dropout or 0) > 0:
        temp += (dtypes.adapter if cast else input_bytes) * linear.d_in
    temp += walk.output_bytes * linear.d_out + dtypes.residual * residual_grads * walk.model.hidden
    return temp + parallel_block_locals(walk)


def parallel_block_locals(walk: LayerWalk) -> float:
    r"""Bytes per token a parallel block's forward still references while its MLP runs, that nothing saved
    for backward: the attention's output, kept until the block adds the MLP's to it (modeling_falcon
    ``FalconDecoderLayer.forward``: ``mlp_output += attention_output``; GPT-J / Phi ``attn_outputs``,
    GPT-NeoX ``attn_output``), and the normalized inputs the layer holds, when none is the storage a saved
    tensor is (autocast's fp32 LayerNorm output, which the frozen projections do not keep and PEFT casts):
    the MLP's argument, and Falcon's ``attention_layernorm_out``, a local of the layer's forward (GPT-NeoX
    passes ``self.input_layernorm(hidden_states)`` as a temporary, released when the attention returns).

    .. math:: o h + \sum_{n \in \text{held, unsaved}} b_n h"""
    model, spec = walk.model, walk.spec
    if not parallel_block(model, spec):
        return 0.0
    mlp_reads = {m.reads for m in spec.linears if m.role == "mlp"} & {"attn_in", "mlp_in"}
    held = mlp_reads | ({"attn_in"} if model.model_type != "gpt_neox" else set())
    unsaved = sum(walk.inputs_dtype.get(k, walk.compute_bytes) for k in held if k not in walk.ledger.items)
    return (walk.output_bytes + unsaved) * model.hidden
