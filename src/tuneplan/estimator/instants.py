"""The instants of a training step and what is live at each, at ``batch`` x ``seq``.

Instants (step >= 2, when optimizer states exist; prior-art notes, e.7):
- ``forward_layers_bottom`` / ``forward_layers_top`` / ``forward_head`` (FSDP2): the bottom layer's, the
  top layer's and an untied head's parameters unsharded in the forward, beside the previous group's
  all-gather output; ``forward_head_popped`` (ZeRO-3, LoRA / QLoRA): the untied head popped by the
  prefetcher in the forward beside the layers it ran ahead to (wrappers/zero3_head_pop);
- ``forward``: end of forward, inside the loss: saved activations + the loss-forward chain;
- ``backward_start``: the loss backward (dense fp32 logit gradients) with all activations still saved;
- ``backward_layers_top`` / ``backward_layers_bottom``: back-propagating the top layer (checkpointing: its
  recomputed activations) with every other saved activation still alive, and the bottom layer with almost
  all gradients allocated;
- ``optimizer_step``: all gradients, states and the step's temporaries;
- where they exist: ``backward_lm_head`` (a 4-bit lm_head), ``backward_head`` (ZeRO-3's trained untied
  head: its whole weight gradient beside what the loss held gathered), ``backward_embedding`` (the token
  embedding's gradient), ``backward_head_gradient`` (a trained untied head's new weight gradient beside
  its accumulated buffer, head_gradient.py), ``next_micro_batch`` (after the longest micro-batch, run
  first), ``initialize`` (before the first step: DeepSpeed ZeRO-1/2's 16-bit cast of a QLoRA model on the GPU,
  wrappers/zero12_initialize, or its flat copy of the trained parameters, wrappers/zero12_flatten),
  ``backward_bottom_layer`` (FSDP2: the bottom layer's end beside the
  embedding group it prefetched; ``backward_bottom_attention``: its attention core's backward, eager),
  ``backward_first_hook`` / ``backward_layer_below_top`` (ZeRO-1/2 LoRA:
  the bucket made at the top layer's first trained gradient, wrapper_rows.first_hook_rows).
Gradients from earlier micro-batches stay alive through the next forward when gradient accumulation > 1;
with GA = 1 the Trainer's ``zero_grad(set_to_none=True)`` frees them before the next forward (unless
``keep_grads``: torch < 2.0's in-place zeroing).

Each instant is one row of step components in :class:`InstantRow`'s field order; the persistent ones
(``MemoryStatics.common``) are the same at every instant. The formulas run on Python ints (one shape) or
numpy arrays broadcast together (a grid) alike (``estimator/xp.py``).

The rows are built as plain tuples in that order and read by name through :func:`named`: the scalar
estimate builds up to eight per call, and building them as ``InstantRow`` measured +1.4 to +2 us on a
memory core of about 5 us and +4 us on a repeated ``tuneplan.estimate()``, past its 50 us target
(benchmarks/estimator_speed.py, side by side with plain tuples).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from tuneplan.estimator.activations import ActivationPlan, saved_at
from tuneplan.estimator.bottom_weight_cast import bottom_weight_cast_row
from tuneplan.estimator.eager_forward import forward_attention_row
from tuneplan.estimator.head_gradient import head_gradient_row
from tuneplan.estimator.layer_scratch import layer_backward_scratch, top_fetch_row, top_layer_terms
from tuneplan.estimator.logits import LogitsPlan, logits_plan
from tuneplan.estimator.memory_statics import MemoryStatics, memory_statics
from tuneplan.estimator.run import Run
from tuneplan.estimator.wrapper_rows import (
    bottom_backward_rows,
    first_hook_rows,
    flush_rows,
    fold_bottom_rows,
    layer_end_rows,
    reduction_rows,
    top_attention_row,
)
from tuneplan.estimator.wrappers.zero3_head_pop_running import checkpointed_mlp_in_flight
from tuneplan.estimator.xp import maximum, minimum


class InstantRow(NamedTuple):
    """The step components live at one instant, in display order after the persistent ones
    (types.COMPONENTS): bytes, as Python ints or int64 arrays of a grid. Its fields are the one definition
    of a row's order (``STEP_COMPONENTS``); an instant's step total is ``sum(row)``."""

    gradients: Any
    optimizer_temp: Any
    activations: Any
    autocast_copies: Any
    logits_loss: Any
    backward_temp: Any
    parallel_buffers: Any


STEP_COMPONENTS: tuple[str, ...] = InstantRow._fields
# an instant's row as the hot path builds it: a plain tuple in InstantRow's field order
Row = tuple[Any, ...]


def named(row: Row) -> InstantRow:
    """``row`` read by its components' names."""
    return InstantRow._make(row)


@dataclass(slots=True)
class MemoryAt:
    """Every instant's components at one shape (ints), or at every shape of a grid (numpy arrays): ``rows``
    maps each instant to its row (read by name through :func:`named`); the persistent components
    (``statics.common``) are the same at every instant: :meth:`components` and :meth:`total` add them.
    (A dataclass with slots: one is made per estimate, in half a NamedTuple's time.)"""

    rows: dict[str, Row]
    acts: ActivationPlan  # the saved activations
    logits: LogitsPlan  # the logits chain
    held: Any  # what the training loop holds between micro-batches
    statics: MemoryStatics

    def components(self, instant: str) -> dict[str, Any]:
        """Every component of ``instant``, in display order."""
        return components_of(self.statics, self.rows[instant])

    def total(self, instant: str) -> Any:
        """Bytes allocated at ``instant`` (exact: the components are ints, or int64 arrays). The row's
        Python ints are added first and its arrays after them: int64 sums are exact in any order, and on a
        grid each operation with an array is a pass over the whole plane."""
        row = self.rows[instant]
        total = self.statics.common_total + sum([v for v in row if v.__class__ is int])
        for v in row:
            if v.__class__ is not int:
                total = total + v
        return total


def components_of(statics: MemoryStatics, row: Row) -> dict[str, Any]:
    """The persistent components and an instant's ``row`` of step components, by name in display order."""
    components = statics.common.copy()
    components.update(zip(STEP_COMPONENTS, row, strict=True))  # named(row)._asdict(), no named tuple
    return components


def memory_at(run: Run, batch: Any, seq: Any) -> MemoryAt:
    """The components live at each instant of the step at ``batch`` x ``seq``.

    Gradients G0 (``earlier_grads``) = earlier micro-batches' + buffers through the forward and the top
    layer's backward, G1 (``all_grads``) = all of them + buffers from the bottom layer on; A = saved
    activations; L = the logits chain (logits.py): forward = G0 + A (+ the previous micro-batch's pinned
    inputs) + autocast copies + L at the loss; backward_start = G0 + A + L's loss backward; the top and
    bottom layers' backward (:func:`layer_backward_rows`); optimizer_step = the step's gradients + its
    temporaries (+ what the loop holds)."""
    statics = run.memo.get("memory") or memory_statics(run)
    acts = saved_at(statics.acts, batch, seq)
    per_elem = statics.logits_per_elem
    if per_elem is not None:  # the default chain, its widths resolved once per run (logits.default_chain)
        elems = batch * seq * statics.vocab
        logits = LogitsPlan(per_elem[0] * elems, per_elem[1] * elems, per_elem[2] * elems)
    else:
        logits = logits_plan(batch * seq, statics.vocab, statics.logit_bytes, run.loss, seq, statics.hidden,
                             statics.softmax_keeps_input, statics.softcap, statics.upcast)
    # What the training loop keeps between micro-batches (LitGPT: ``logits`` and ``loss`` stay bound until
    # the next micro-batch rebinds them; the loss's graph keeps bitsandbytes' pinned matmul inputs).
    holds, first = statics.holds, statics.first
    held = logits.held if holds else 0
    # a loop that drops its outputs after the step holds them through the backward and the step only
    # (fsdp_qlora train.py; simulate: fsdp_qlora, Meta-Llama-3-8B full fp32 at the root unit's end)
    in_step = logits.held if holds or statics.holds_to_step else 0
    pinned = acts.pinned_bytes
    prev_pinned = pinned if holds and not first else 0
    prev_held = 0 if first else held
    head_dequant = statics.head_dequant
    if per_elem is not None and not head_dequant:
        # the default chain holds nothing between micro-batches, casts nothing apart and its loss forward
        # holds its forward's end and more (logits.default_chain's widths): the first term is the largest
        forward_logits = logits.forward_peak
    else:
        forward_logits = maximum(maximum(logits.forward_peak, prev_held + logits.cast_peak),
                                 prev_held + logits.at_forward_end + head_dequant)
    earlier_grads, saved = statics.earlier_grads, acts.saved_bytes
    # one row per instant, in InstantRow's field order: gradients, optimizer_temp, activations,
    # autocast_copies, logits_loss, backward_temp, parallel_buffers; the loss instants first (memory.memory_of
    # takes them as the first two rows)
    rows = {
        "forward": (earlier_grads, 0, saved + prev_pinned, statics.autocast_copies, forward_logits, 0,
                    statics.gathered_at_forward_end),
        "backward_start": (earlier_grads, 0, saved, statics.autocast_copies_backward, logits.backward_peak, 0,
                           statics.gathered_at_loss),
    }
    if statics.wrapper_rows:  # FSDP's and ZeRO-3's own (none on one GPU or under DDP: one test per run)
        gathered_forward_rows(rows, run, statics, acts, logits, held, prev_pinned, prev_held)
    if statics.eager_forward is not None:  # eager attention's softmax in a checkpointed forward
        rows["forward_attention"] = forward_attention_row(statics.eager_forward, statics, acts, batch, seq,
                                                          prev_pinned, prev_held)
    if head_dequant:
        # the 4-bit lm_head's backward: every chunk's 16-bit logit gradient is ready (the loss backward ran
        # first), the held outputs, and the whole head dequantized again for the input gradient
        head_backward = in_step + logits.at_forward_end + head_dequant
        rows["backward_lm_head"] = (earlier_grads, 0, saved, 0, head_backward, 0, statics.gathered)
    if statics.head_gradient:  # an untied head's new weight gradient beside its buffer (head_gradient.py)
        rows["backward_head_gradient"] = head_gradient_row(run, statics, saved, acts.tokens)
    layer_backward_rows(rows, statics, acts, in_step, batch * seq)
    if statics.bottom_weight_cast:  # the bottom layer's weight gradient beside its fp32 copy
        rows["backward_bottom_weight_cast"] = bottom_weight_cast_row(run, statics, acts,
                                                                     rows["backward_layers_bottom"])
    if statics.head_gradient_in_layers:  # a trained untied head's new gradient, made before the top layer's
        top = rows["backward_layers_top"]  # backward (head_gradient.head_gradient_in_layers)
        rows["backward_layers_top"] = (top[0] + statics.head_gradient_in_layers, *top[1:])
    kept = pinned if holds else 0
    if statics.next_micro_batch:
        # The micro-batch after the longest: gradients accumulated over the longest one, and (in a loop that
        # holds them) its outputs and pinned inputs; its own, shorter activations are not known: not counted
        rows["next_micro_batch"] = (statics.next_grads, 0, kept, 0, held, 0, statics.gathered)
    rows["optimizer_step"] = (statics.step_grads, statics.step_temp, kept, 0, in_step, 0, 0)
    if statics.wrapped.initialize:
        # DeepSpeed's initialize, before the first step (wrappers/zero12_initialize.py, zero12_flatten.py):
        # nothing of the step is live and the persistent terms are not yet the step's; the row carries its
        # total's difference from them as DeepSpeed's own allocation (the 16-bit copies of the module's cast,
        # or the flat group)
        rows["initialize"] = (0, 0, 0, 0, 0, 0, statics.wrapped.initialize - statics.common_total)
    return MemoryAt(rows, acts, logits, held, statics)


def gathered_forward_rows(rows: dict[str, Row], run: Run, statics: MemoryStatics, acts: ActivationPlan,
                          logits: LogitsPlan, held: Any, prev_pinned: Any, prev_held: Any) -> None:
    """The instants where FSDP or ZeRO-3 holds parameters gathered in the forward and at the loss, added to
    ``rows`` after ``backward_start``: the untied tail's reduce-scatter, FSDP1's root pre-backward, FSDP2's
    bottom, top and head copy-outs, ZeRO-3's trained untied head's backward."""
    earlier_grads, saved = statics.earlier_grads, acts.saved_bytes
    tail = statics.tail_reduce
    if tail is not None:  # FSDP2's untied tail reduce-scattered (wrappers/fully_shard.tail_reduce_scatter)
        rows["backward_tail_reduce"] = (earlier_grads + tail.gradients, 0, saved - acts.tail_bytes, 0, held,
                                        tail.scratch, tail.gathered)
    if statics.gathered_root_pre_backward:
        # FSDP1's root pre-backward, before the loss's backward: what the loss's forward left (at most its
        # forward peak) beside the root and its shard's device copy, or the top layer it prefetches and the
        # shard that all-gather reads (wrappers/fsdp1_offload.root_pre_backward_gathered)
        rows["backward_root_pre"] = (earlier_grads, 0, saved, statics.autocast_copies_backward,
                                     logits.forward_peak, 0, statics.gathered_root_pre_backward)
    if statics.gathered_bottom_forward:
        # FSDP2: a layer's copy-out in the forward (wrappers/fully_shard.py), FSDP1: the root's unshard
        # (wrappers/fsdp1_offload.root_forward_unshard); at the bottom layer nothing is saved yet, at the
        # top every layer below it has saved its activations
        rows["forward_layers_bottom"] = (earlier_grads, 0, prev_pinned, 0, prev_held, 0,
                                         statics.gathered_bottom_forward)
    if statics.gathered_top_forward:
        below_top = saved - acts.tail_bytes - (0 if statics.checkpointed else acts.top_layer_bytes)
        rows["forward_layers_top"] = (earlier_grads, 0, below_top + prev_pinned, statics.autocast_copies,
                                      prev_held, 0, statics.gathered_top_forward)
    popped, below, past_attention = statics.gathered_head_popped
    if popped:
        # ZeRO-3 (LoRA / QLoRA): the untied head popped by the prefetcher beside the layers not yet run; the
        # layers below have saved their share of the activations, the running one (not checkpointed) what
        # it saved before its MLP block when the linear is in it (wrappers/zero3_head_pop.py)
        running = (acts.top_layer_bytes - acts.mlp_saved_bytes
                   if past_attention and not statics.checkpointed else 0)
        if past_attention and statics.checkpointed:
            # checkpointed: its input and the MLP's in-flight tensors (wrappers/zero3_head_pop_running.py)
            running = checkpointed_mlp_in_flight(run, acts.tokens)
        share = statics.n_layers
        rows["forward_head_popped"] = (earlier_grads, 0, (saved - acts.tail_bytes) * below // share
                                       + running + prev_pinned, statics.autocast_copies * below // share,
                                       prev_held, 0, popped)
    top_gathered = statics.wrapped.gathered.top_layer_past_attention
    if top_gathered:
        # ZeRO-3 (LoRA / QLoRA, no checkpointing): the top layer past its attention, before or in its MLP
        # block; the layers below have saved their share, the top one what it saved before its MLP block
        # (wrappers/zero3_plain_trace.py)
        below, share = statics.n_layers - 1, statics.n_layers
        rows["forward_top_past_attention"] = (
            earlier_grads, 0, (saved - acts.tail_bytes) * below // share + acts.top_layer_bytes
            - acts.mlp_saved_bytes + prev_pinned, statics.autocast_copies * below // share, prev_held, 0,
            top_gathered)
    if statics.gathered_head_forward:
        # the optimizer's states not made yet when that is the first step's (counted by the persistent terms)
        unmade = statics.wrapped.gathered.head_forward_states_unmade
        rows["forward_head"] = (earlier_grads, -unmade, saved - acts.tail_bytes + prev_pinned,
                                statics.autocast_copies, prev_held, 0, statics.gathered_head_forward)
    if statics.gathered_head_backward:
        rows["backward_head"] = head_backward_row(run, statics, saved, acts.tokens)


def head_backward_row(run: Run, statics: MemoryStatics, saved: Any, tokens: Any) -> Row:
    """ZeRO-3's trained untied head: its weight gradient (dlogits^T x, whole, in the compute dtype) is made
    from the logits' gradient cast back to the compute dtype, the head still gathered (a fused linear loss
    makes no whole logits: its chunks are counted by the loss backward)."""
    head_grad = run.model.lm_head_params * run.dtypes.compute
    dlogits = 0 if run.loss == "fused_linear" else statics.logit_bytes * tokens * statics.vocab
    return (statics.earlier_grads, 0, saved, 0, dlogits, head_grad, statics.gathered_head_backward)


def layer_backward_rows(rows: dict[str, Row], statics: MemoryStatics, acts: ActivationPlan,
                        held: Any, tokens: Any) -> None:
    """Add the layers' backward to ``rows``: the top layer (G0 + every saved activation but what it frees +
    its scratch; checkpointed: the tail's released, the top layer recomputed), the bottom layer (G1 + the
    bottom layer's activations or recomputation + its scratch: the larger of the layer's backward
    temporaries and bitsandbytes' dequantized weight with what is live beside it) and the embedding's
    backward where it has an instant of its own."""
    # (the plain scratch without the call: memory_statics resolved that it has no other term)
    backward_temp = (acts.backward_temp_bytes + statics.dequant if statics.plain_scratch
                     else layer_backward_scratch(statics, acts, tokens))
    saved, gathered = acts.saved_bytes, statics.gathered
    embedding_cut, embedding_row = (embedding_backward_row(acts, statics, held)
                                    if statics.embedding_into_buffer is not None else (0, None))
    wrapper_rows = statics.wrapper_rows
    top_grads, top_freed, top_scratch, top_gathered, top_casts = top_layer_terms(statics, acts, tokens,
                                                                                 backward_temp)
    bottom_grads = statics.all_grads_in_layer - embedding_cut
    if statics.checkpointed:
        # the head and the final norm have been back-propagated (their saved tensors released) by the time
        # the top layer is recomputed (simulate: Llama-3.2-1B reward-model QLoRA)
        recomputed = acts.recompute_bytes
        top_acts = saved - acts.tail_bytes + recomputed - top_freed
        # the head's 16-bit cast, saved for its input gradient, is released by the head's backward, which
        # runs before the top layer's (simulate: Llama-3.1-405B QLoRA at 4 layers, 1 x 256 tokens)
        # beside the outputs a loop that drops them only after the step still holds (fsdp_qlora train.py:
        # ``output = None`` after ``optimizer.step()``; simulate: fsdp_qlora, Mistral-7B LoRA fp32 under
        # checkpointing, its fp32 logits at the top layer); other loops' holdings are not simulated here. The
        # bottom row, an upper bound that already counts the bottom layer's own gradients beside its whole
        # recomputation, is left without them (simulate: fsdp_qlora, Llama-2-7b full bf16_autocast at 3
        # layers: with them it would exceed the run's peak, the embedding's backward, by 4 %)
        kept = held if statics.holds_to_step else 0
        # the recomputed layer's 16-bit weight casts under autocast (weights.recompute_casts)
        casts = statics.recompute_casts
        rows["backward_layers_top"] = (top_grads, 0, top_acts, casts, kept, top_scratch, top_gathered)
        # the recomputed top layer's experts gathered again, in every pass or in the recording one, the
        # optimizer's states not made then (wrappers/zero3_expert_round.py)
        fetch_row = (top_fetch_row(statics, statics.wrapped.gathered.states_unmade,
                                   saved - acts.tail_bytes + recomputed, casts, kept)
                     if wrapper_rows else None)
        bottom_recomputed = recomputed - minimum(recomputed, statics.bottom_own_grads)  # bottom_own_gradients
        rows["backward_layers_bottom"] = (bottom_grads, 0, bottom_recomputed, statics.recompute_casts_bottom,
                                          0, backward_temp, gathered)
        # a lower layer's end (backward_layer_end) is a moment, not a bound: the held outputs are beside it
        # (simulate: fsdp_qlora, Mistral-7B LoRA with CPU offload, the next layer gathered)
        bottom_acts, bottom_held = recomputed, kept
    else:
        rows["backward_layers_top"] = (top_grads, 0, saved - top_freed, top_casts, held, top_scratch,
                                       top_gathered)
        fetch_row = None
        # bitsandbytes' pinned inputs are not released as the layers are back-propagated
        bottom_acts = acts.top_layer_bytes + acts.pinned_bytes - acts.pinned_bytes // statics.n_layers
        if statics.bottom_own_grads:  # a full fine-tune's bottom layer (memory_statics.bottom_own_gradients)
            bottom_acts = bottom_acts - minimum(acts.top_layer_bytes, statics.bottom_own_grads)
        bottom_row: Row = (bottom_grads, 0, bottom_acts, 0, held, backward_temp, gathered)
        if wrapper_rows:
            # ZeRO-1/2's bucket, not there before the top layer's first trained gradient
            if statics.wrapped.top_layer is None:
                bottom_row = first_hook_rows(rows, statics, acts, bottom_row)
            top_attention_row(rows, statics, acts, held)  # FSDP2's (wrappers/fully_shard_attention.py)
            # ZeRO-3's recording pass, before the first optimizer step (wrappers/zero3_expert_round.py)
            fetch_row = top_fetch_row(statics, statics.wrapped.gathered.states_unmade,
                                      saved - acts.tail_bytes, statics.autocast_copies, held)
        rows["backward_layers_bottom"] = bottom_row
        bottom_held = held
    if wrapper_rows:
        if fetch_row is not None:
            rows["backward_top_fetch"] = fetch_row
        if statics.wrapped.bottom_layer is not None:
            fold_bottom_rows(rows, statics.wrapped.bottom_layer, any(kind[5] for kind in statics.acts.kinds),
                             bottom_held, acts)
        if statics.gathered_layer_end:
            layer_end_rows(rows, statics, acts, tokens, (top_grads, bottom_grads), bottom_acts, bottom_held)
        flush_rows(rows, statics, acts, top_grads, held, backward_temp)
        bottom_backward_rows(rows, statics, acts, held, backward_temp, embedding_cut)
    if embedding_row is not None:
        rows["backward_embedding"] = embedding_row
    if wrapper_rows:
        reduction_rows(rows, statics, held, (saved - acts.tail_bytes, bottom_acts), bottom_held)


def embedding_backward_row(acts: ActivationPlan, statics: MemoryStatics,
                           held: Any = 0) -> tuple[Any, Row | None]:
    """(what the bottom layer's gradients lack, the embedding backward's row) on a single GPU (checked against
    the simulate engine): the token-embedding gradient is the last one made, so the bottom layer runs without
    it, and the embedding backward adds its scratch (tied weights: the out-of-place sum of the lm_head and
    embedding contributions) on top of every gradient, with no activation left (activations.
    embedding_backward). When a buffer is already there (a later micro-batch of an accumulation, or
    keep_grads' zeroed buffer) the new gradient is a temporary that AccumulateGrad adds into it in place
    (simulate: Qwen2.5-0.5B fp32 GA=2, +1 embedding-sized tensor), and the bottom layer has the buffer.
    ``held``: what the loop keeps through the backward, beside it where the loop drops its outputs only
    after the step (fsdp_qlora train.py sets ``output = None`` after ``optimizer.step()``; simulate:
    fsdp_qlora, Llama-3.2-1B full on one GPU, its fp32 logits there); other loops' holdings are not
    simulated here."""
    if not acts.embedding_grad_bytes:
        return 0, None
    kept = held if statics.holds_to_step else 0
    zero_held = statics.wrapped.embedding
    if zero_held is not None:
        # ZeRO-1/2 (wrappers/zero.zero12_grads_at_embedding): the bucket and what DeepSpeed holds, plus the
        # new gradient and its temporaries; ZeRO-1's layer rows already count the embedding's gradient
        cut = acts.embedding_grad_bytes if zero_held.layers_hold_it else 0
        return cut, (zero_held.gradients + acts.embedding_grad_bytes, 0, 0, 0, kept,
                     acts.embedding_backward_bytes, 0)
    grad = minimum(acts.embedding_grad_bytes, statics.grads)
    if statics.embedding_into_buffer:
        cut, temp = 0, acts.embedding_backward_bytes + grad
    else:
        cut, temp = grad, acts.embedding_backward_bytes
    return cut, (statics.all_grads, 0, 0, 0, kept, temp, 0)
