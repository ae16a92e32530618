r"""ZeRO-3 QLoRA / LoRA under checkpointing: what the running layer holds in flight where the prefetcher pops
the untied head in the forward (zero3_head_pop.py, ``forward_head_popped``), at a linear of its MLP block.

A checkpointed layer's forward saves nothing for backward (``torch.utils.checkpoint``: reentrant under
``no_grad``, non-reentrant with saved-tensor hooks that keep no tensor), but what its Python code still
references is alive: the layer's own input (its checkpoint, beside the layers below's), the residual after
the attention, the MLP norm's output (transformers' ``LlamaDecoderLayer.forward``: ``residual``,
``hidden_states``; the MLP's argument ``x``), and the MLP's input projections' outputs, or what replaced
them (``LlamaMLP.forward``: ``act_fn(gate_proj(x))`` beside ``up_proj(x)``; ``Phi3MLP.forward``: the fused
``gate_up_proj`` output, chunked):

.. math:: R = t \,\big(2\, h\, b_{res} + h\, b_{norm} + \sum_{l \in \text{mlp\_in}} d_{out,l}\, b_{lin}\big)

exact at the last input projection, a lower bound at the down projection (its input, the product, and
output beside them). (simulate: Mistral-7B-Instruct-v0.3, 4 layers, QLoRA nf4 in bf16 over 4 GPUs, 384
tokens, second step: at layer 3's ``up_proj`` the layer input, the residual and the norm output,
3 x 3,145,728, ``act_fn(gate)`` and ``up_proj``'s output, 2 x 11,010,048 bytes, the step's peak.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuneplan.estimator.bnb_scope import quantized

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def checkpointed_mlp_in_flight(run: Run, tokens: Any) -> Any:
    """Bytes :math:`R` the running checkpointed layer holds at its MLP's input projections (module
    docstring), the top layer kind's."""
    spec, dtypes, h = run.model.layer_groups[-1][0], run.dtypes, run.model.hidden
    bits = run.setup.quant_bits
    outputs = sum(m.d_out * (dtypes.quant_out if bits is not None and quantized(m, run.profile.model_code)
                             else dtypes.linear_out)
                  for m in spec.linears if m.reads == "mlp_in")
    return tokens * (2 * h * dtypes.residual + h * dtypes.norm_out + outputs)
