"""FSDP2's lower trained layer (``backward_layers_bottom``) and top layer at their attention core's backward,
where it materialises the scores' gradients (eager attention, SDPA's math path), torch 2.13 ``_fully_shard``.

Each decoder layer is one group; autograd makes each weight's unsharded gradient as the layer's backward
reaches its linear (``FSDPParam.unsharded_param.grad``), and the group's ``post_backward``
(``_fsdp_param_group.py``) gathers them into ``foreach_reduce``'s flat reduce-scatter input only after the
whole layer is back-propagated: within the layer the gradients made stay unsharded, one tensor each. The
layer's backward runs in reverse forward order, so when its attention core is back-propagated (the scores'
gradients beside the saved probabilities: the layer's largest scratch) its MLP's linears and the attention
output projection have made their gradients, and autograd has released the MLP block's saved tensors
(a node's saved tensors are freed after its backward: netted in the attention's own scratch,
``ActivationPlan.attention_backward_bytes``, ``S_attention``)::

    gradients = G - b + sum_{m in MLP} n_m d_in d_out g + d_in d_out(o_proj) g,
    activations = A,  scratch = S_attention

with ``b`` the layer's unsharded gradient bytes, ``g = b / layer parameters`` bytes per element, ``A`` one
layer's activations. The top layer alike (``top_layer_attention``, ``wrapper_rows.top_attention_row``),
beside every lower layer's activations.

- A freeze run's lowest trained layer, frozen layers below it (no saved activations: autograd records
  nothing for them): the row's ``A`` is its own. The row is then also the larger of the layer's start (its
  activations, none of its gradients) and its end (its gradients made, its activations released:
  ``wrapper_rows.folded_layer_row``), beside the two layers unsharded and the layer above's
  reduce-scatter input, which the group's ``post_backward`` drops (``reduce_scatter_max_input_buffers``
  = 1) before this layer's own is allocated. It is folded whatever the attention kernel: each weight's
  gradient is made by the backward of the op that saved its input (``MmBackward0``, ``AddmmBackward0``),
  which frees that input as it returns, so the gradients grow as the activations go and no moment holds
  the whole of both (simulate: pythia-6.9b freeze of 2 of 3 layers, flash attention, checkpointed, 4
  GPUs: layer 1's recomputation and its 0.4 GB of gradients never live together). Under checkpointing
  with the embedding's output requiring grad (``fully_shard.embedding_output_requires_grad``) the frozen
  layers below are back-propagated after it for their input's gradient
  (``fsdp1_bottom.layers_below_back_propagated``): each one's recomputation and scratch without a
  gradient, beside a layer pair no larger than the row's and at most the reduce-scatter input above it,
  is under the folded row's start.
- A trained layer below (full fine-tune; every layer trained): the row is the second layer's, whose
  lower layer's activations are saved beside it: ``activations = A + A``, the row itself left
  unfolded (its ``A`` bounds the lower layer's, its end).

Elsewhere (no materialised scores: a flash or memory-efficient kernel) there is no attention-core row; a
trained layer below leaves the row unfolded.

Not for LoRA, accumulation without sync (``fully_shard_accumulation``), gradient checkpointing with a
trained layer below (the recomputed layer's moment is below the unfolded row), or a freeze run with one
trained layer (its lower row is a frozen layer's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.base import TopLayer
from tuneplan.estimator.wrappers.fsdp1_bottom import attention_moment_elements

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def lower_trained_layer(run: Run, buffers: int, gathered: int, accumulates: bool) -> TopLayer | None:
    """The lower row's layer as a :class:`TopLayer` (the module docstring): ``buffers`` its unsharded
    gradient bytes, ``gathered`` the row's unsharded bytes, ``accumulates`` whether micro-batches accumulate
    unsharded; None where it does not apply."""
    setup, model = run.setup, run.model
    if setup.method not in ("full", "freeze") or model.n_layers < 2 or accumulates or not buffers:
        return None
    trained = model.n_layers if setup.method == "full" else min(setup.freeze_trainable_layers, model.n_layers)
    below = trained == model.n_layers  # a trained layer below the row's, its activations saved
    if trained < 2 or (below and setup.gradient_checkpointing):
        return None
    per_elem = round(buffers / max(model.largest_layer_params, 1))
    return TopLayer(counted=buffers, gradients_at_end=buffers, gathered=gathered, keeps_scratch=True,
                    gradients_at_attention=attention_moment_elements(run) * per_elem,
                    attention_scratch_only=True, attention_below_saved=below,
                    fold="never" if below else "always")


def top_layer_attention(run: Run, buffers: int, accumulates: bool) -> int:
    """The top layer's weight gradients made at its attention core's backward (the module docstring's
    ``G_attention``; ``wrapper_rows.top_attention_row``): 0 where it does not apply (LoRA, accumulation
    without sync)."""
    if run.setup.method not in ("full", "freeze") or accumulates or not buffers:
        return 0
    return attention_moment_elements(run) * round(buffers / max(run.model.largest_layer_params, 1))
