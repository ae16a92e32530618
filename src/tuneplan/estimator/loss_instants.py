"""Which of the two loss instants (``forward``, ``backward_start``: allocator_segments.LOSS_INSTANTS, the
first two rows of instants.memory_at) can be the step's peak, resolved once per run from its
shape-independent terms."""

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
