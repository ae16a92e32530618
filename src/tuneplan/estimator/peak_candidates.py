"""Instants that can never be the step's peak, resolved once per run from its shape-independent terms
(instants.memory_at's rows): ``memory_of`` does not total them. The rows are still built (every instant's
total is shown); only the choice of the peak skips them, and only where the inequality holds at every
shape."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuneplan.estimator.memory_statics import MemoryStatics


def backward_start_leads(statics: MemoryStatics) -> bool:
    """Whether ``backward_start`` holds more than ``forward`` at every shape (instants.memory_at's rows, same
    gradients and activations in both), so that ``forward`` can never be the peak and, stranding no more
    (allocator_segments.stranded_bytes: the 16-bit logits' segments at ``backward_start`` only), never
    decides the reserved figure either: the
    default logits chain without a 4-bit head's dequantization, whose loss backward is wider per element than
    its loss forward (logits.default_chain: ``3 l + kept + capped > c + upcast copy + l + capped``, tokens x
    vocabulary >= 1 element), nothing pinned from the previous micro-batch, and neither autocast's copies nor
    the wrapper's gathered parameters fewer at the loss backward than at the forward's end."""
    widths = statics.logits_per_elem
    return (widths is not None and widths[2] > widths[1] and not statics.head_dequant
            and not (statics.holds and not statics.first)
            and statics.autocast_copies_backward >= statics.autocast_copies
            and statics.gathered_at_loss >= statics.gathered_at_forward_end)


def step_below_bottom(statics: MemoryStatics) -> bool:
    """Whether ``optimizer_step``, the last row, never exceeds ``backward_layers_bottom``, which comes before
    it and so wins a tie: without a wrapper's rows or DeepSpeed's initialize, with nothing the loop holds
    (its ``kept`` and ``in_step`` terms 0), no embedding gradient cut from the bottom layer
    (instants.embedding_backward_row: none where the gradient lands in a buffer or has no instant), the
    step's gradients and temporaries at most the bottom layer's gradients; every other term of the bottom
    row (activations or recomputation, casts, held outputs, scratch, gathered) is a byte count >= 0."""
    return (not statics.wrapper_rows and not statics.wrapped.initialize
            and not statics.holds and not statics.holds_to_step
            and statics.embedding_into_buffer is not False
            and statics.step_grads + statics.step_temp <= statics.all_grads_in_layer)
