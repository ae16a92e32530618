"""The layer being back-propagated: its scratch (activation gradients, a fused expert stack's weight-gradient
moment, a quantized linear's dequantization) and the top layer's backward terms (``instants.
layer_backward_rows`` writes their rows)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuneplan.estimator.activations import ActivationPlan
from tuneplan.estimator.layer_end_casts import top_layer_row_casts
from tuneplan.estimator.memory_statics import MemoryStatics
from tuneplan.estimator.xp import maximum, minimum

if TYPE_CHECKING:
    from tuneplan.estimator.instants import Row


def layer_backward_scratch(statics: MemoryStatics, acts: ActivationPlan, tokens: Any, unmade: int = 0,
                           upper: bool = False) -> Any:
    """The scratch of the layer being back-propagated: its backward temporaries (or a fused expert stack's
    weight-gradient moment, less ``unmade``: bytes the row counts that do not exist yet at that moment)
    and a quantized linear's dequantization scratch, or the larger moment of the layer's largest new weight
    gradient beside its accumulated buffer (memory_statics) or of bitsandbytes' dequantized weight
    (quant_kernels). ``upper``: the top layer's, without the lower kinds' (ActivationPlan.
    upper_backward_temp_bytes)."""
    layers = acts.upper_backward_temp_bytes if upper else acts.backward_temp_bytes
    # plain (MemoryStatics.plain_scratch): max(layers, 0) + dequant = layers + dequant, layers >= 0
    backward_temp = maximum(layers, acts.expert_stack_bytes - unmade) + statics.dequant
    if statics.new_grad_temp:
        backward_temp = maximum(backward_temp, statics.new_grad_temp)
    if statics.backward_dequant:
        backward_temp = maximum(backward_temp,
                                statics.backward_dequant + tokens * statics.backward_dequant_per_token)
    return backward_temp


def top_layer_terms(statics: MemoryStatics, acts: ActivationPlan, tokens: Any,
                    backward_temp: Any) -> tuple[Any, Any, Any, Any, Any]:
    """The top layer's backward row terms: (gradients, activations it has freed, scratch, gathered,
    autocast casts). Without a wrapper's top layer: the layer's earlier gradients beside all of its
    activations and scratch. FSDP, ZeRO-3 (wrappers/base.TopLayer): the top layer's unsharded gradients are
    made as its activations are released; the row's total is the larger of its start (all activations and
    the scratch, none of its gradients) and its end (its gradients, its activations gone)."""
    top_grads, top_freed = statics.earlier_grads_in_layer, 0
    if statics.wrapped.top_layer is None and not statics.wrapped.first_hook_bucket:
        # no wrapper's top layer: the upper kinds' scratch, every saved cast but the head's, which dies with
        # the head's backward, run before the top layer's (layer_end_casts.head_and_top_layer_casts)
        scratch = (acts.upper_backward_temp_bytes + statics.dequant if statics.plain_scratch
                   else layer_backward_scratch(statics, acts, tokens, upper=True))
        return (top_grads, top_freed, scratch, statics.gathered,
                statics.autocast_copies - statics.head_top_casts[0])
    # ZeRO-1/2's bucket, made by the first gradient hook: not there yet at the top layer's first fused
    # expert stack when nothing trained precedes it (wrappers/zero.py)
    top_scratch = (layer_backward_scratch(statics, acts, tokens, statics.wrapped.first_hook_bucket)
                   if statics.wrapped.first_hook_bucket else backward_temp)
    top_gathered, top_casts = statics.gathered, statics.autocast_copies
    top = statics.wrapped.top_layer
    if top is None:
        return top_grads, top_freed, top_scratch, top_gathered, top_casts
    at_end, top_gathered = top.gradients_at_end, top.gathered
    if top.gathered_at_attention:
        # where an eager core's scores' gradients are the layer's largest scratch, what is unsharded then
        # (a bool times an int: a Python number, or a grid's array)
        attention = acts.attention_backward_bytes
        at_core = (attention >= acts.backward_temp_bytes) * (attention > 0)
        top_gathered = top_gathered + (top.gathered_at_attention - top_gathered) * at_core
    top_grads = statics.earlier_grads_in_layer - top.counted + at_end
    # checkpointed: the recomputation's weight casts (weights.recompute_casts) are released with it
    top_freed = minimum(acts.recompute_bytes + statics.recompute_casts if statics.checkpointed
                        else acts.top_layer_bytes, at_end)
    top_scratch = (backward_temp if top.keeps_scratch
                   else backward_temp - minimum(backward_temp, at_end - top_freed))
    # autocast's saved casts: the head's released, the top layer's as its gradients are made
    top_casts = top_layer_row_casts(statics.autocast_copies, statics.head_top_casts,
                                    at_end - top_freed - (backward_temp - top_scratch))
    return top_grads, top_freed, top_scratch, top_gathered, top_casts


def top_fetch_row(statics: MemoryStatics, unmade: int, acts: Any, casts: Any, held: Any) -> Row | None:
    """ZeRO-3's top layer's backward fetch of its fused experts (``Gathered.top_layer_backward_fetch``; None
    without one): the layer's activations ``acts`` (the tail back-propagated), none of its scratch yet; the
    optimizer's states not made yet (``unmade``, counted by the persistent terms) in the recording pass."""
    fetch = statics.wrapped.gathered.top_layer_backward_fetch
    if not fetch:
        return None
    return (statics.earlier_grads_in_layer, -unmade, acts, casts, held, 0, fetch)
