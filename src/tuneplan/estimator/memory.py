"""Per-GPU peak memory of a training step: the persistent terms plus the largest of the instants
(``instants.py``, from the shape-independent terms of ``memory_statics.py``), with the reserved and device
figures, the bands and the notes."""

from __future__ import annotations

from itertools import islice
from typing import Any

from tuneplan.estimator.activations import ActivationPlan
from tuneplan.estimator.allocator_segments import LOSS_INSTANTS, reserved_figures
from tuneplan.estimator.instants import STEP_COMPONENTS, MemoryAt, components_of, memory_at
from tuneplan.estimator.memory_statics import MemoryStatics
from tuneplan.estimator.overhead import (
    CUDA_CONTEXT_BAND,
    cross_stream_reserve,
    cuda_context_bytes,
    reserved_band,
)
from tuneplan.estimator.run import Run, resolve_run
from tuneplan.estimator.types import GIB, Band, MemoryBreakdown, built_on_read
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

ACTIVATION_BAND = 0.10  # +-10% on saved activations until simulate has checked the architecture
ALLOCATED_WHY = "activation and loss terms +-10% (saved-tensor model)"
RESERVED_WHY = "caching-allocator fragmentation (emulated, not yet measured on GPU)"
# the bands' terms in an instant's row (InstantRow's field order)
ACTIVATIONS, LOGITS_LOSS, BACKWARD_TEMP = (STEP_COMPONENTS.index(name)
                                           for name in ("activations", "logits_loss", "backward_temp"))
CUDA_CONTEXT = Band(CUDA_CONTEXT_BAND[0], CUDA_CONTEXT_BAND[1], "driver, CUDA version, lazy loading")


def memory_breakdown(model: ModelSpec, setup: TrainSetup) -> MemoryBreakdown:
    """Analytic per-GPU memory of ``setup`` (already resolved against its profile)."""
    return memory_of(resolve_run(model, setup))


def memory_of(run: Run) -> MemoryBreakdown:
    """Analytic per-GPU memory of a resolved run at its own batch and seq (an :class:`AnalyticBreakdown`):
    the instant with the largest allocated total (the first one on a tie), the reserved and device figures;
    its components, the other instants' totals, the bands and the notes are built from the same instants
    when first read."""
    live = memory_at(run, run.setup.batch, run.setup.seq)
    # Python ints at one shape (activations_at truncates its float sums): the totals are exact in any order,
    # so the persistent part, the same at every instant, is added once after the choice. The loss instants
    # are memory_at's first two rows: their totals, which the reserved figure reads too, are taken first
    rows, statics = live.rows, live.statics
    forward, backward_start = LOSS_INSTANTS
    at_backward_start = sum(rows[backward_start])
    if statics.backward_start_leads:
        # forward holds less and strands no more (peak_candidates.backward_start_leads): it neither is the
        # peak nor decides the reserved figure, which takes the loss backward's total for both
        at_forward, step, peak = at_backward_start, at_backward_start, backward_start
    else:
        at_forward = sum(rows[forward])
        step, peak = ((at_backward_start, backward_start) if at_backward_start > at_forward
                      else (at_forward, forward))
    # optimizer_step, the last row, left out where it can never peak (peak_candidates.step_below_bottom)
    for instant, row in islice(rows.items(), 2, len(rows) - 1 if statics.step_below_bottom else None):
        total = sum(row)
        if total > step:
            step, peak = total, instant
    base = statics.common_total
    return AnalyticBreakdown(run, live, peak, base + step, base + at_forward, base + at_backward_start)


class AnalyticBreakdown(MemoryBreakdown):
    """:func:`memory_of`'s result. The peak instant and the allocated, reserved and device peaks (what a
    verdict needs) are set when it is made; ``components`` (the peak instant's), ``instants`` (every
    instant's total), ``bands`` and ``notes`` are built from the instants on first read and kept
    (types.built_on_read): the values a face reads are the ones an eager breakdown held, and a search that
    only asks whether the setup fits does not build them."""

    def __init__(self, run: Run, live: MemoryAt, peak: str, allocated: int, at_forward: int,
                 at_backward_start: int) -> None:
        """``at_forward``, ``at_backward_start``: the allocated totals at the loss instants
        (allocator_segments.LOSS_INSTANTS)."""
        self.peak_instant = peak
        reserved, needed = reserved_figures(run, allocated, at_forward, at_backward_start, live.acts.tokens)
        self.reserved_peak_bytes, self.releasable_bytes = reserved, reserved - needed
        self.nccl_bytes = live.statics.wrapped.resident.nccl
        self._run, self._live, self._allocated = run, live, allocated

    # the analytic CUDA context is one figure for every run (overhead.cuda_context_bytes): a class value, read
    # by every verdict, not a call per estimate (an instance value set by a caller still takes its place)
    cuda_context_bytes = cuda_context_bytes()

    @property
    def allocated_peak_bytes(self) -> int:
        # the sum of the components, which is the peak instant's total until a caller edits the components
        return sum(self.components.values()) if "components" in self.__dict__ else self._allocated

    @built_on_read
    def per_card(self) -> list[dict[str, Any]]:
        # one card's run: the device_map estimate sets its cards on the fullest card's breakdown
        return []

    @built_on_read
    def paged_bytes(self) -> int:
        return self._live.statics.optimizer.paged

    @built_on_read
    def host_bytes(self) -> int:
        return self._live.statics.wrapped.resident.host + self._live.acts.offloaded_bytes

    @built_on_read
    def components(self) -> dict[str, int]:
        return components_of(self._live.statics, self._live.rows[self.peak_instant])

    @built_on_read
    def instants(self) -> dict[str, int]:
        base = self._live.statics.common_total
        return {instant: base + sum(row) for instant, row in self._live.rows.items()}

    @built_on_read
    def bands(self) -> dict[str, Band]:
        allocated, row = self._allocated, self._live.rows[self.peak_instant]
        # the row's activations, logits_loss and backward_temp, read by position (InstantRow's field order)
        transient = row[ACTIVATIONS] + row[LOGITS_LOSS] + row[BACKWARD_TEMP]
        # only FSDP caches per stream (cross_stream_reserve): the other runs skip the call
        cross_stream = cross_stream_reserve(self._run) if self._run.setup.fsdp else 0
        return {
            "allocated": Band(int(allocated - ACTIVATION_BAND * transient),
                              int(allocated + ACTIVATION_BAND * transient), ALLOCATED_WHY),
            "reserved": Band(*reserved_band(allocated, self.reserved_peak_bytes, cross_stream), RESERVED_WHY),
            "cuda_context": CUDA_CONTEXT,
        }

    @built_on_read
    def notes(self) -> list[str]:
        acts, held, statics = self._live.acts, self._live.held, self._live.statics
        notes = list(statics.base_notes)
        if acts.offloaded_bytes or held or statics.head_dequant or (acts.pinned_bytes and statics.holds):
            notes.extend(shape_notes(self._run, statics, acts, held))
        return notes


def shape_notes(run: Run, statics: MemoryStatics, acts: ActivationPlan, held: int) -> list[str]:
    """The notes that name a shape-dependent amount: offloaded activations, held outputs, pinned inputs, a
    4-bit lm_head's dequantized weight."""
    notes = []
    pinned, head_dequant = acts.pinned_bytes, statics.head_dequant
    if acts.offloaded_bytes:
        notes.append(f"{acts.offloaded_bytes / GIB:.2f} GiB of saved activations offloaded to CPU")
    if held:
        notes.append(f"{run.profile.label}: the training loop keeps the last micro-batch's logits "
                     f"({held / GIB:.2f} GiB) through backward, the optimizer step and the next forward")
    if pinned and statics.holds:
        notes.append(f"bitsandbytes <= 0.43 keeps every 4-bit matmul input ({pinned / GIB:.2f} GiB) for as "
                     "long as the loss's graph lives (the next micro-batch's forward included)")
    if head_dequant:
        notes.append("the 4-bit lm_head dequantizes its whole weight for every chunk "
                     f"({head_dequant / GIB:.2f} GiB live)")
    return notes
