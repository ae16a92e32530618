"""The recomputed layer's 4-bit down projection in its forward: bitsandbytes' dequantized weight beside the
layer's partial recomputation and the backward's incoming gradients.

Under gradient checkpointing a layer is run forward again inside the backward (torch utils/checkpoint.py),
with the gradients of the layer's output already live. bitsandbytes' ``Linear4bit.forward`` casts its input
to the compute dtype (``x.to(self.compute_dtype)``: a copy when the input is wider, an fp32 activation of a
model whose fp32 LayerNorm output promoted the MLP) and ``MatMul4Bit.forward`` runs
``F.linear(A, dequantize_4bit(W).to(A.dtype).t())`` (bitsandbytes autograd/_functions.py): the whole weight in
the compute dtype lives with the matmul's output (tokens x d_out, compute dtype). At the MLP's down
projection the layer's forward has not run the down projection's LoRA adapter yet (PEFT
``lora.bnb.Linear4bit.forward`` runs the base layer first), so its private tensors are not made; alive and
saved by nothing are:

- the down projection's input (the activation's output / gated product: ``self.dense_4h_to_h(x)`` holds
  it), unless an op before it saved it;
- the MLP's input, which the decoder layer's forward holds while its MLP runs (transformers' decoder layers:
  ``hidden_states = self.mlp(hidden_states)``; Falcon ``mlp_output = self.mlp(mlp_layernorm_out)``) unless
  saved;
- in a parallel block (lora_bottom_layer.parallel_block) the attention's output, added after the MLP
  (Falcon ``mlp_output += attention_output``, GPT-NeoX ``mlp_output + attn_output + hidden_states``), and in
  Falcon's decoder layer the attention norm's output too (``attention_layernorm_out``, a local of
  ``FalconDecoderLayer.forward`` until it returns).

Per token, relative to the layer's whole ledger L (the row already counts it), with :math:`m` the down
input's bytes, :math:`c` the compute dtype's, :math:`S` the down projection's adapter-private tensors (its
ledger items, not made yet) and the residual gradients :math:`g r h` (layer_saved.residual_grads, in the
layer output's dtype: fp32 where the MLP's 4-bit linears promote it)::

    P = m d_in [unsaved] + c d_in [m != c] + c d_out + sum(locals) + g r h - S

beside the weight :math:`c\\, d_{in} d_{out}` (simulate: Falcon-40B QLoRA with LoRA on the MLP under FSDP1,
checkpointed, bf16 autocast: the peak at ``dense_4h_to_h.base_layer``'s ``mm`` in the recomputation, the
fp32 GELU output, its bf16 cast and both fp32 LayerNorm outputs beside the dequantized 8192 x 32768 weight).
"""

from __future__ import annotations

from tuneplan.estimator.layer_walk import LayerWalk
from tuneplan.estimator.lora_bottom_layer import parallel_block
from tuneplan.specs.model import Linear


def record_down_dequant(walk: LayerWalk, key_in: str, down: Linear, made: dict[str, float],
                        mlp_reads: str, residual_grads: int) -> None:
    """Set ``walk.recompute_dequant`` to the bytes per token beside the recomputed down projection's
    dequantized weight (module docstring), relative to the layer's whole ledger, and note how many ledger
    items came before the down projection (:func:`down_dequant_reached`). Left at 0 without checkpointing, a
    4-bit model or a dense MLP (``key_in`` "mlp.mid"). ``made``: the ledger items the down projection's walk
    added (its input, when it saved it first, and its adapter's private tensors)."""
    if walk.setup.gradient_checkpointing and walk.quantized and key_in == "mlp.mid":
        walk.recompute_dequant = _down_temp(walk, key_in, down, made, mlp_reads, residual_grads)
        walk.keys_before_down = len(walk.ledger.items) - len(made)


def down_dequant_reached(walk: LayerWalk) -> float:
    """``walk.recompute_dequant`` where the recomputation reaches the down projection, else 0. torch's
    non-reentrant checkpoint stops the recomputation once the last tensor the original forward saved is
    saved again (utils/checkpoint.py ``_StopRecomputationError``, early stop on by default): a down
    projection that saves nothing (a frozen 4-bit base without an adapter), with nothing saved after it in
    the layer, is never run again (simulate: Llama-2-70B QLoRA on q / v, checkpointed: the recomputation
    ends at the gated product, its peak at ``up_proj``)."""
    return walk.recompute_dequant if len(walk.ledger.items) > walk.keys_before_down else 0.0


def _down_temp(walk: LayerWalk, key_in: str, down: Linear, made: dict[str, float],
               mlp_reads: str, residual_grads: int) -> float:
    d_in, d_out = down.d_in, down.d_out
    model, ledger, compute = walk.model, walk.ledger.items, walk.compute_bytes
    mid_bytes = walk.inputs_dtype.get(key_in, compute)
    temp = 0.0 if key_in in ledger and key_in not in made else float(mid_bytes * d_in)
    if mid_bytes != compute:
        temp += compute * d_in
    temp += compute * d_out
    locals_ = {mlp_reads}
    if parallel_block(model, walk.spec):
        temp += walk.out_bytes("attn_core") * model.hidden
        if model.model_type == "falcon":
            locals_.add("attn_in")
    temp += sum(walk.inputs_dtype.get(key, compute) * model.hidden
                for key in locals_ if key not in ledger)
    # the layer's output gradient comes in the output's dtype: fp32 where the MLP's 4-bit linears return their
    # fp32 input's dtype (layer_walk.out_bytes) and promote the residual sum
    grad_bytes = max(walk.dtypes.residual, walk.out_bytes(key_in))
    return temp + grad_bytes * residual_grads * model.hidden - sum(made.values())
