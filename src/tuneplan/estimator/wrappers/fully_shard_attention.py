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
  = 1) before this layer's own is allocated.
- A trained layer below (full fine-tune; every layer trained): the row is the second layer's, whose
  lower layer's activations are saved beside it: ``activations = A + A``, the row itself left
  unfolded (its ``A`` bounds the lower layer's, its end).

Elsewhere (no materialised scores: a flash or memory-efficient kernel, whose in-layer moments this does not
count) the unfolded row stays the upper bound.

Not for LoRA, accumulation without sync (``fully_shard_accumulation``), gradient checkpointing with a
trained layer below (the recomputed layer's moment is below the unfolded row), or a freeze run whose lower
row is a frozen layer (one trained layer, or frozen layers back-propagated for their input's gradient).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.base import TopLayer
from tuneplan.estimator.wrappers.fsdp1_bottom import attention_moment_elements, layers_below_back_propagated

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
    if trained < 2 or layers_below_back_propagated(run) or (below and setup.gradient_checkpointing):
        return None
    per_elem = round(buffers / max(model.largest_layer_params, 1))
    return TopLayer(counted=buffers, gradients_at_end=buffers, gathered=gathered, keeps_scratch=True,
                    gradients_at_attention=attention_moment_elements(run) * per_elem,
                    attention_scratch_only=True, attention_below_saved=below,
                    fold="never" if below else "with_attention")


def top_layer_attention(run: Run, buffers: int, accumulates: bool) -> int:
    """The top layer's weight gradients made at its attention core's backward (the module docstring's
    ``G_attention``; ``wrapper_rows.top_attention_row``): 0 where it does not apply (LoRA, accumulation
    without sync)."""
    if run.setup.method not in ("full", "freeze") or accumulates or not buffers:
        return 0
    return attention_moment_elements(run) * round(buffers / max(run.model.largest_layer_params, 1))
