"""Per-GPU peak memory: persistent terms plus the max over the instants of a training step.

Instants (step >= 2, when optimizer states exist; prior-art notes, e.7):
- ``forward``: end of forward, inside the loss: saved activations + the loss-forward chain;
- ``backward_start``: the loss backward (dense fp32 logit gradients) with all activations still saved;
- ``backward_layers``: back-propagating the top layer (checkpointing: its recomputed activations) with
  every other saved activation still alive, and the bottom layer with almost all gradients allocated;
- ``optimizer_step``: all gradients, states and the step's temporaries.
Gradients from earlier micro-batches stay alive through the next forward when gradient accumulation > 1;
with GA = 1 the Trainer's ``zero_grad(set_to_none=True)`` frees them before the next forward (unless
``keep_grads``: torch < 2.0's in-place zeroing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneplan.estimator.activations import ActivationPlan, ActivationTerms, activation_terms, saved_at
from tuneplan.estimator.allocator_segments import LOSS_INSTANTS, reserved_peak
from tuneplan.estimator.logits import LogitsPlan, logits_plan
from tuneplan.estimator.optimizer import OptimizerPlan, optimizer_plan
from tuneplan.estimator.overhead import (
    CUBLAS_WORKSPACE,
    CUDA_CONTEXT_BAND,
    cross_stream_reserve,
    cuda_context_bytes,
    reserved_band,
)
from tuneplan.estimator.quant_kernels import dequant_transient_bytes
from tuneplan.estimator.run import Run, resolve_run
from tuneplan.estimator.types import GIB, Band, MemoryBreakdown, built_on_read
from tuneplan.estimator.wrappers.base import EndOfBackward, WrapperMemory
from tuneplan.estimator.xp import ceil_div, maximum, minimum
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

ACTIVATION_BAND = 0.10  # +-10% on saved activations until simulate has checked the architecture
# the components of every instant, in display order after the persistent ones (types.COMPONENTS)
CUDA_CONTEXT = Band(CUDA_CONTEXT_BAND[0], CUDA_CONTEXT_BAND[1], "driver, CUDA version, lazy loading")
STEP_COMPONENTS = ("gradients", "optimizer_temp", "activations", "autocast_copies", "logits_loss",
                   "backward_temp", "parallel_buffers")
# the transient ones' places in an instant's row (the allocated band's +-10%)
ACTIVATIONS, LOGITS_LOSS, BACKWARD_TEMP = (STEP_COMPONENTS.index(c) for c in ("activations", "logits_loss",
                                                                              "backward_temp"))


@dataclass(frozen=True)
class MemoryStatics:
    """What does not depend on batch x seq: persistent terms, gradients, optimizer, sharding, and the switches
    that choose which instants exist, resolved once per run so that :func:`memory_at` is arithmetic."""

    opt: OptimizerPlan
    wrapped: WrapperMemory  # what the data-parallel wrapper keeps at each instant (run.wrapper.memory)
    common: dict[str, int]  # weights, quant_meta, lora_adapters, optimizer_states, framework
    common_total: int  # sum of ``common``, the persistent part of every instant's total
    grads: int  # gradients once backward has run
    grads_prev: int  # gradients alive through the next forward (accumulation / keep_grads)
    grads_step: int  # gradients the optimizer step sees
    ac: int  # autocast weight copies through the forward
    ac_bwd: int  # ... and from the loss backward on
    head_deq: int  # a quantized lm_head's dequantized weight, live per chunk
    dequant: int  # the largest quantized linear's dequantization scratch
    acts: ActivationTerms  # the saved-activation terms (activations.saved_at)
    # the logits chain's arguments (logits.logits_plan)
    vocab: int
    logit_bytes: int
    hidden: int
    softmax_keeps_input: bool
    softcap: bool  # the model caps its logits with tanh (logits.logits_plan)
    holds: bool  # the training loop keeps the last micro-batch's outputs (profile.loop_holds_outputs)
    first: bool  # the longest micro-batch runs first (setup.longest_batch_first)
    checkpointed: bool
    n_layers: int
    # the token-embedding gradient's instant (single GPU, no optimizer in backward): None when it has none;
    # True when a buffer is already there (accumulation / keep_grads), so the new gradient is a temporary
    embedding_into_buffer: bool | None
    # gradients with their buffers: G0 (earlier micro-batches') and G1 (all), + FSDP's reduce-scatter input
    # while a layer is back-propagated; ZeRO-3 / FSDP parameters gathered at the loss and in the layers
    g0: int
    g1: int
    g0_layer: int
    g1_layer: int
    gathered_at_forward_end: int  # FSDP2: the tail group (norm + head) unsharded at the loss
    gathered_at_loss: int
    gathered: int
    # FSDP2's embedding backward: (gradients held to the end of the backward, buffers) or None
    end_of_backward: EndOfBackward | None
    next_micro_batch: bool  # the instant after the longest micro-batch (longest first, accumulation)
    next_grads: int  # gradients at that instant, buffers included
    step_grads: int  # gradients at the optimizer step, buffers included
    step_temp: int  # the optimizer step's temporaries (0 when it runs in backward)
    base_notes: tuple[str, ...]  # sharding and optimizer notes


def memory_statics(run: Run) -> MemoryStatics:
    """The shape-independent terms of ``run``, computed once and kept on it."""
    cached: MemoryStatics | None = run.memo.get("memory")
    if cached is not None:
        return cached
    model, setup, prof, dt, pp = run.model, run.setup, run.profile, run.dtypes, run.param_plan
    # A quantized lm_head dequantizes its whole weight for every chunk of the forward
    head_deq = (int(prof.dequant_bytes_per_elem * model.head_width * model.hidden)
                if setup.quant_bits is not None and prof.quantizes_lm_head else 0)
    opt = optimizer_plan(run.optimizer, pp.trainable_params, pp.trainable_bytes,
                         pp.trainable_tensors, pp.largest_trainable_tensor, pp.factored_elems)
    wm = run.wrapper.memory(run, opt)
    resident, buckets, sharded = wm.resident, wm.buckets, run.wrapper.shards_parameters
    grads, grads_prev, grads_step = gradient_terms(run, wm)
    ac = pp.autocast_copy_bytes
    # From the loss backward on, only the casts autograd saved remain (weights.param_plan: under gradient
    # checkpointing the layers' casts die with autocast's cache at the end of the forward).
    ac_bwd = pp.autocast_copy_backward_bytes
    if sharded:
        ac = ceil_div(ac, setup.world_size)
        ac_bwd = ceil_div(ac_bwd, setup.world_size)
    common = {
        "weights": resident.weights,
        "quant_meta": ceil_div(pp.quant_meta_bytes,
                               setup.world_size if sharded and prof.quant_meta_sharded else 1),
        "lora_adapters": resident.adapters,
        "optimizer_states": resident.states,
        "framework": CUBLAS_WORKSPACE,
    }
    acts = activation_terms(model, setup, dt, run.layers, gc_offload=prof.gc_offload,
                            quant_saves_input=prof.quant_saves_input, quant_lm_head=prof.quantizes_lm_head)
    embedding = None
    if acts.method == "full" and setup.world_size == 1 and not setup.optimizer_in_backward:
        embedding = setup.keep_grads or setup.grad_accum > 1
    elif acts.method == "full" and wm.embedding is not None:
        embedding = False  # ZeRO-1/2: the hooks move each gradient out (estimator/wrappers/zero.py)
    out = MemoryStatics(
        opt=opt, wrapped=wm, common=common, common_total=sum(common.values()),
        grads=grads, grads_prev=grads_prev, grads_step=grads_step, ac=ac, ac_bwd=ac_bwd, head_deq=head_deq,
        dequant=dequant_transient_bytes(model, setup, prof), acts=acts, vocab=model.head_width,
        logit_bytes=dt.compute if dt.autocast else (dt.trainable if setup.method == "full" else dt.non_block),
        hidden=model.hidden, softmax_keeps_input=setup.softmax_keeps_input, holds=prof.loop_holds_outputs,
        softcap=bool(model.config.get("final_logit_softcapping")) and not setup.num_labels,
        first=setup.longest_batch_first, checkpointed=bool(setup.gradient_checkpointing),
        n_layers=max(model.n_layers, 1),
        embedding_into_buffer=embedding, g0=grads_prev + buckets.persistent, g1=grads + buckets.persistent,
        g0_layer=grads_prev + buckets.persistent + buckets.in_layers,
        # near the bottom of the backward some sharded gradients are not made yet (FSDP2)
        g1_layer=grads + buckets.persistent + buckets.in_layers - buckets.missing_at_bottom,
        gathered_at_forward_end=wm.gathered.at_forward_end, gathered_at_loss=wm.gathered.at_loss,
        end_of_backward=wm.end_of_backward,
        gathered=wm.gathered.in_layers, next_micro_batch=setup.longest_batch_first and setup.grad_accum > 1,
        next_grads=(wm.no_sync.accumulating if wm.no_sync is not None else grads) + buckets.persistent,
        step_grads=grads_step + buckets.persistent,
        step_temp=0 if setup.optimizer_in_backward else resident.optimizer_temp,
        base_notes=wm.notes + tuple(opt.notes))
    run.memo["memory"] = out
    return out


def gradient_terms(run: Run, wm: WrapperMemory) -> tuple[int, int, int]:
    """(gradients once backward has run, those alive through the next forward, those the optimizer step
    sees), per GPU: an optimizer in backward keeps only the largest tensor's gradient; earlier micro-batches'
    gradients (accumulation) or the previous step's zeroed buffers (keep_grads) stay through the forward;
    under the profile's FSDP wrapping (wrappers/fsdp.no_sync_gradients) accumulating micro-batches keep
    unsharded gradients of whole units and the step sees the reduce-scattered shard; with the longest
    micro-batch first, the peak batch is the run's first: nothing has accumulated yet."""
    setup, pp = run.setup, run.param_plan
    grads, fg = wm.resident.gradients, wm.no_sync
    if setup.optimizer_in_backward:
        grads = min(grads, pp.largest_trainable_tensor * pp.trainable_bytes)
    accumulates = (setup.grad_accum > 1 or setup.keep_grads) and not setup.optimizer_in_backward
    grads_prev = grads if accumulates else 0
    grads_step = grads
    if fg is not None:
        grads, grads_step = fg.accumulating, fg.synced
        grads_prev = fg.accumulating if setup.grad_accum > 1 else 0
    if setup.longest_batch_first:
        grads_prev = 0
    return grads, grads_prev, grads_step


class MemoryAt:
    """Every instant's components at one shape (ints), or at every shape of a grid (numpy arrays).
    ``phases`` maps each instant to its step components, a row in ``STEP_COMPONENTS`` order; the persistent
    ones (``statics.common``) are the same at every instant: ``components`` and ``total`` add them."""

    __slots__ = ("phases", "acts", "logits", "held", "statics")

    def __init__(self, phases: dict[str, tuple[Any, ...]], acts: ActivationPlan, logits: LogitsPlan,
                 held: Any, statics: MemoryStatics) -> None:
        self.phases, self.acts, self.logits, self.held, self.statics = phases, acts, logits, held, statics

    def components(self, phase: str) -> dict[str, Any]:
        """Every component of ``phase``, in display order."""
        return components_of(self.statics, self.phases[phase])

    def total(self, phase: str) -> Any:
        """Bytes allocated at ``phase`` (exact: the components are ints, or int64 arrays)."""
        return self.statics.common_total + sum(self.phases[phase])


def components_of(st: MemoryStatics, row: tuple[Any, ...]) -> dict[str, Any]:
    """The persistent components and an instant's ``row`` of step components, by name in display order."""
    comps = st.common.copy()
    comps.update(zip(STEP_COMPONENTS, row, strict=True))
    return comps


def memory_at(run: Run, batch: Any, seq: Any) -> MemoryAt:
    """:func:`instants` as a record (the grid's form; the scalar :func:`memory_of` reads the tuple)."""
    return MemoryAt(*instants(run, batch, seq))


Instants = tuple[dict[str, tuple[Any, ...]], ActivationPlan, LogitsPlan, Any, "MemoryStatics"]


def instants(run: Run, batch: Any, seq: Any) -> Instants:
    """(phases, saved activations, logits chain, what the loop holds, the run's statics): the components live
    at each instant of the step at ``batch`` x ``seq``: Python ints, or numpy arrays broadcast together (a
    grid); the formulas are the same either way (``estimator/xp.py``).

    Gradients G0 = earlier micro-batches' + buffers through the forward and the top layer's backward, G1 =
    all of them + buffers from the bottom layer on; A = saved activations; L = the logits chain (logits.py):
    forward = G0 + A (+ the previous micro-batch's pinned inputs) + autocast copies + L at the loss;
    backward_start = G0 + A + L's loss backward; the top and bottom layers' backward as below; optimizer_step
    = the step's gradients + its temporaries (+ what the loop holds)."""
    st = run.memo.get("memory") or memory_statics(run)
    acts = saved_at(st.acts, batch, seq)
    lg = logits_plan(batch * seq, st.vocab, st.logit_bytes, run.loss, seq, st.hidden, st.softmax_keeps_input,
                     st.softcap)
    # What the training loop keeps between micro-batches (LitGPT: ``logits`` and ``loss`` stay bound until
    # the next micro-batch rebinds them; the loss's graph keeps bitsandbytes' pinned matmul inputs).
    holds, first = st.holds, st.first
    held = lg.held if holds else 0
    pinned = acts.pinned_bytes
    prev_pinned = pinned if holds and not first else 0
    prev_held = 0 if first else held
    head_deq = st.head_deq
    fwd_logits = maximum(maximum(lg.forward_peak, prev_held + lg.cast_peak),
                         prev_held + lg.at_forward_end + head_deq)
    g0, g0_layer, g1_layer = st.g0, st.g0_layer, st.g1_layer
    acts_fwd, ac, ac_bwd = acts.saved_bytes, st.ac, st.ac_bwd
    # a quantized linear's dequantization scratch, live while the layer being back-propagated runs
    bwd = acts.backward_temp_bytes + st.dequant
    loss_gathered, gathered = st.gathered_at_loss, st.gathered
    emb_cut, emb_row = embedding_backward_row(acts, st) if st.embedding_into_buffer is not None else (0, None)
    kept = pinned if holds else 0
    # one row per instant, in STEP_COMPONENTS order:
    # gradients, optimizer_temp, activations, autocast_copies, logits_loss, backward_temp, parallel_buffers
    phases: dict[str, tuple[Any, ...]] = {
        "forward": (g0, 0, acts_fwd + prev_pinned, ac, fwd_logits, 0, st.gathered_at_forward_end),
        "backward_start": (g0, 0, acts_fwd, ac_bwd, lg.backward_peak, 0, loss_gathered),
    }
    if head_deq:
        # the 4-bit lm_head's backward: every chunk's 16-bit logit gradient is ready (the loss backward ran
        # first), the held outputs, and the whole head dequantized again for the input gradient
        phases["backward_lm_head"] = (g0, 0, acts_fwd, 0, held + lg.at_forward_end + head_deq, 0, gathered)
    top_g, top_freed, top_scratch, top_gathered = g0_layer, 0, bwd, gathered
    top = st.wrapped.top_layer
    if top is not None:
        # FSDP, ZeRO-3 (wrappers/base.TopLayer): the top layer's unsharded gradients are made as its
        # activations are released; the row's total is the larger of its start (all activations and the
        # scratch, none of its gradients) and its end (its gradients, its activations gone)
        at_end, top_gathered = top.gradients_at_end, top.gathered
        top_g = g0_layer - top.counted + at_end
        top_freed = minimum(acts.recompute_bytes if st.checkpointed else acts.top_layer_bytes, at_end)
        top_scratch = bwd if top.keeps_scratch else bwd - minimum(bwd, at_end - top_freed)
    if st.checkpointed:
        # the head and the final norm have been back-propagated (their saved tensors released) by the time
        # the top layer is recomputed (simulate: Llama-3.2-1B reward-model QLoRA)
        recomputed = acts.recompute_bytes
        top_acts = acts_fwd - acts.tail_bytes + recomputed - top_freed
        phases["backward_layers_top"] = (top_g, 0, top_acts, ac_bwd, 0, top_scratch, top_gathered)
        phases["backward_layers_bottom"] = (g1_layer - emb_cut, 0, recomputed, 0, 0, bwd, gathered)
    else:
        phases["backward_layers_top"] = (top_g, 0, acts_fwd - top_freed, ac, held, top_scratch, top_gathered)
        # bitsandbytes' pinned inputs are not released as the layers are back-propagated
        bottom_acts = acts.top_layer_bytes + pinned - pinned // st.n_layers
        phases["backward_layers_bottom"] = (g1_layer - emb_cut, 0, bottom_acts, 0, held, bwd, gathered)
    if emb_row is not None:
        phases["backward_embedding"] = emb_row
    end = st.end_of_backward
    if end is not None:  # FSDP2's embedding backward (wrappers/fsdp.fully_shard_terms)
        phases["backward_embedding"] = (st.g1 + end.gradients, 0, 0, 0, 0, 0, end.gathered)
    if st.next_micro_batch:
        # The micro-batch after the longest: gradients accumulated over the longest one, and (in a loop that
        # holds them) its outputs and pinned inputs; its own, shorter activations are not known: not counted
        phases["next_micro_batch"] = (st.next_grads, 0, kept, 0, held, 0, gathered)
    phases["optimizer_step"] = (st.step_grads, st.step_temp, kept, 0, held, 0, 0)
    return phases, acts, lg, held, st


def embedding_backward_row(acts: ActivationPlan, st: MemoryStatics) -> tuple[Any, tuple[Any, ...] | None]:
    """(what the bottom layer's gradients lack, the embedding backward's row) on a single GPU (checked against
    the simulate engine): the token-embedding gradient is the last one made, so the bottom layer runs without
    it, and the embedding backward adds its scratch (tied weights: the out-of-place sum of the lm_head and
    embedding contributions) on top of every gradient, with no activation left (activations.
    embedding_backward). When a buffer is already there (a later micro-batch of an accumulation, or
    keep_grads' zeroed buffer) the new gradient is a temporary that AccumulateGrad adds into it in place
    (simulate: Qwen2.5-0.5B fp32 GA=2, +1 embedding-sized tensor), and the bottom layer has the buffer."""
    if not acts.embedding_grad_bytes:
        return 0, None
    held = st.wrapped.embedding
    if held is not None:
        # ZeRO-1/2 (wrappers/zero.zero12_grads_at_embedding): the bucket and what DeepSpeed holds, plus the
        # new gradient and its temporaries; ZeRO-1's layer rows already count the embedding's gradient
        cut = acts.embedding_grad_bytes if held.layers_hold_it else 0
        return cut, (held.gradients + acts.embedding_grad_bytes, 0, 0, 0, 0, acts.embedding_backward_bytes, 0)
    grad = minimum(acts.embedding_grad_bytes, st.grads)
    if st.embedding_into_buffer:
        cut, temp = 0, acts.embedding_backward_bytes + grad
    else:
        cut, temp = grad, acts.embedding_backward_bytes
    return cut, (st.g1, 0, 0, 0, 0, temp, 0)


def memory_breakdown(model: ModelSpec, setup: TrainSetup) -> MemoryBreakdown:
    """Analytic per-GPU memory of ``setup`` (already resolved against its profile)."""
    return memory_of(resolve_run(model, setup))


def memory_of(run: Run) -> MemoryBreakdown:
    """Analytic per-GPU memory of a resolved run at its own batch and seq (an :class:`AnalyticBreakdown`):
    the instant with the largest allocated total (the first one on a tie), the reserved and device figures;
    its components, the other instants' totals, the bands and the notes are built from the same instants
    when first read."""
    at = instants(run, run.setup.batch, run.setup.seq)
    # Python ints at one shape (activations_at truncates its float sums): the totals are exact in any order,
    # so the persistent part, the same at every instant, is added once after the choice (-1 - base: the
    # totals' floor of -1)
    base = at[4].common_total
    step, peak = -1 - base, ""
    for k, row in at[0].items():
        t = sum(row)
        if t > step:
            step, peak = t, k
    return AnalyticBreakdown(run, at, peak, base + step)


class AnalyticBreakdown(MemoryBreakdown):
    """:func:`memory_of`'s result. The peak instant and the allocated, reserved and device peaks (what a
    verdict needs) are set when it is made; ``components`` (the peak instant's), ``phases`` (every instant's
    total), ``bands`` and ``notes`` are built from the instants on first read and kept (types.built_on_read):
    the values a face reads are the ones an eager breakdown held, and a search that only asks whether the
    setup fits does not build them."""

    def __init__(self, run: Run, at: Instants, peak: str, allocated: int) -> None:
        self.peak_phase = peak
        base, rows = at[4].common_total, at[0]
        loss = {k: base + sum(rows[k]) for k in LOSS_INSTANTS if k in rows}
        self.reserved_peak_bytes = reserved_peak(run, allocated, loss, run.setup.batch, run.setup.seq)
        self.cuda_context_bytes = cuda_context_bytes()
        self.nccl_bytes = at[4].wrapped.resident.nccl
        self._run, self._at, self._allocated = run, at, allocated

    @property
    def allocated_peak_bytes(self) -> int:
        # the sum of the components, which is the peak instant's total until a caller edits the components
        comps = self.__dict__.get("components")
        return self._allocated if comps is None else sum(comps.values())

    @built_on_read
    def per_card(self) -> list[dict[str, Any]]:
        # one card's run: the device_map estimate sets its cards on the fullest card's breakdown
        return []

    @built_on_read
    def paged_bytes(self) -> int:
        return self._at[4].opt.paged

    @built_on_read
    def host_bytes(self) -> int:
        return self._at[4].wrapped.resident.host + self._at[1].offloaded_bytes

    @built_on_read
    def components(self) -> dict[str, int]:
        phases, st = self._at[0], self._at[4]
        return components_of(st, phases[self.peak_phase])

    @built_on_read
    def phases(self) -> dict[str, int]:
        phases, base = self._at[0], self._at[4].common_total
        return {k: base + sum(row) for k, row in phases.items()}

    @built_on_read
    def bands(self) -> dict[str, Band]:
        allocated, row = self._allocated, self._at[0][self.peak_phase]
        transient = row[ACTIVATIONS] + row[LOGITS_LOSS] + row[BACKWARD_TEMP]
        return {
            "allocated": Band(int(allocated - ACTIVATION_BAND * transient),
                              int(allocated + ACTIVATION_BAND * transient),
                              "activation and loss terms +-10% (saved-tensor model)"),
            "reserved": Band(*reserved_band(allocated, self.reserved_peak_bytes,
                                            cross_stream_reserve(self._run)),
                             "caching-allocator fragmentation (emulated, not yet measured on GPU)"),
            "cuda_context": CUDA_CONTEXT,
        }

    @built_on_read
    def notes(self) -> list[str]:
        _, acts, _, held, st = self._at
        notes = list(st.base_notes)
        if acts.offloaded_bytes or held or st.head_deq or (acts.pinned_bytes and st.holds):
            notes.extend(shape_notes(self._run, st, acts, held))
        return notes


def shape_notes(run: Run, st: MemoryStatics, acts: ActivationPlan, held: int) -> list[str]:
    """The notes that name a shape-dependent amount: offloaded activations, held outputs, pinned inputs, a
    4-bit lm_head's dequantized weight."""
    notes = []
    pinned, head_deq = acts.pinned_bytes, st.head_deq
    if acts.offloaded_bytes:
        notes.append(f"{acts.offloaded_bytes / GIB:.2f} GiB of saved activations offloaded to CPU")
    if held:
        notes.append(f"{run.profile.label}: the training loop keeps the last micro-batch's logits "
                     f"({held / GIB:.2f} GiB) through backward, the optimizer step and the next forward")
    if pinned and st.holds:
        notes.append(f"bitsandbytes <= 0.43 keeps every 4-bit matmul input ({pinned / GIB:.2f} GiB) for as "
                     "long as the loss's graph lives (the next micro-batch's forward included)")
    if head_deq:
        notes.append("the 4-bit lm_head dequantizes its whole weight for every chunk "
                     f"({head_deq / GIB:.2f} GiB live)")
    return notes
