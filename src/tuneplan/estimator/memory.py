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

from tuneplan.estimator.activations import ActivationPlan, activations_at
from tuneplan.estimator.fsdp_grads import FsdpGrads, fsdp_gradients
from tuneplan.estimator.logits import LogitsPlan, logits_plan
from tuneplan.estimator.optimizer import OptimizerPlan, optimizer_plan
from tuneplan.estimator.overhead import (
    CUBLAS_WORKSPACE,
    CUDA_CONTEXT_BAND,
    FRAGMENTATION_BAND,
    cuda_context_bytes,
    reserved_from_allocated,
)
from tuneplan.estimator.parallel import ShardPlan, shard
from tuneplan.estimator.quant_kernels import dequant_transient_bytes
from tuneplan.estimator.run import Run, resolve_run
from tuneplan.estimator.types import Band, MemoryBreakdown
from tuneplan.estimator.xp import maximum, minimum
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

ACTIVATION_BAND = 0.10  # +-10% on saved activations until simulate has checked the architecture
# the components of every instant, in display order after the persistent ones (types.COMPONENTS)
CUDA_CONTEXT = Band(CUDA_CONTEXT_BAND[0], CUDA_CONTEXT_BAND[1], "driver, CUDA version, lazy loading")
STEP_COMPONENTS = ("gradients", "optimizer_temp", "activations", "autocast_copies", "logits_loss",
                   "backward_temp", "parallel_buffers")


@dataclass(frozen=True)
class MemoryStatics:
    """What does not depend on batch x seq: persistent terms, gradients, optimizer, sharding."""

    opt: OptimizerPlan
    sp: ShardPlan
    fg: FsdpGrads | None
    common: dict[str, int]  # weights, quant_meta, lora_adapters, optimizer_states, framework
    blank: dict[str, int]  # ``common`` with every step component at 0: the template of an instant
    common_total: int  # sum of ``common``, the persistent part of every instant's total
    grads: int  # gradients once backward has run
    grads_prev: int  # gradients alive through the next forward (accumulation / keep_grads)
    grads_step: int  # gradients the optimizer step sees
    ac: int  # autocast weight copies through the forward
    ac_bwd: int  # ... and from the loss backward on
    head_deq: int  # a quantized lm_head's dequantized weight, live per chunk
    dequant: int  # the largest quantized linear's dequantization scratch


def memory_statics(run: Run) -> MemoryStatics:
    """The shape-independent terms of ``run``, computed once and kept on it."""
    cached = run.memo.get("memory")
    if cached is not None:
        return cached
    model, setup, prof, dt, pp = run.model, run.setup, run.profile, run.dtypes, run.param_plan
    # A quantized lm_head dequantizes its whole weight for every chunk of the forward
    head_deq = (int(prof.dequant_bytes_per_elem * model.head_width * model.hidden)
                if setup.quant_bits is not None and prof.quantizes_lm_head else 0)
    opt = optimizer_plan(run.optimizer, pp.trainable_params, pp.trainable_bytes,
                         pp.trainable_tensors, pp.largest_trainable_tensor, pp.factored_elems)
    sp = shard(model, setup, weights=pp.weight_bytes + pp.adapter_bytes, layer_stored_bytes=pp.largest_layer_bytes,
               trainable_params=pp.trainable_params,
               trainable_bytes=pp.trainable_bytes, trainable_weight_params=pp.trainable_weight_params,
               states=opt.states, optimizer_temp=opt.temp, compute_bytes=dt.compute,
               optimizer=run.optimizer,
               root_embeddings=setup.method in prof.fsdp_root_embeddings)
    # Split the sharded weights back into base weights and adapters for display.
    adapters = min(pp.adapter_bytes, sp.weights) if not (setup.zero == 3 or setup.fsdp) else -(-pp.adapter_bytes // setup.world_size)
    if setup.zero and pp.trainable_bytes > dt.compute:
        adapters = pp.adapter_params * dt.compute // (setup.world_size if setup.zero == 3 else 1)
    weights = max(sp.weights - adapters, 0)

    grads = sp.grads_live
    if setup.optimizer_in_backward:
        grads = min(grads, pp.largest_trainable_tensor * pp.trainable_bytes)
    # earlier micro-batches' gradients (accumulation), or the previous step's zeroed buffers (keep_grads)
    grads_prev = grads if (setup.grad_accum > 1 or setup.keep_grads) and not setup.optimizer_in_backward else 0
    grads_step = grads
    fg = fsdp_gradients(model, setup, prof, dt, pp.trainable_params, pp.adapter_params)
    if fg is not None:
        # The profile's FSDP wrapping (estimator/fsdp_grads.py): accumulating micro-batches keep unsharded
        # gradients of whole units; the optimizer step sees the reduce-scattered shard.
        grads, grads_step = fg.accumulating, fg.synced
        grads_prev = fg.accumulating if setup.grad_accum > 1 else 0
    if setup.longest_batch_first:
        grads_prev = 0  # the peak batch is the run's first micro-batch: no gradient has accumulated yet
    ac = pp.autocast_copy_bytes
    # From the loss backward on, only the casts autograd saved remain (weights.param_plan: under gradient
    # checkpointing the layers' casts die with autocast's cache at the end of the forward).
    ac_bwd = pp.autocast_copy_backward_bytes
    if setup.zero == 3 or setup.fsdp:
        ac = -(-ac // setup.world_size)
        ac_bwd = -(-ac_bwd // setup.world_size)
    common = {
        "weights": weights,
        "quant_meta": -(-pp.quant_meta_bytes // (setup.world_size if (setup.zero == 3 or setup.fsdp)
                                                 and prof.quant_meta_sharded else 1)),
        "lora_adapters": adapters,
        "optimizer_states": sp.states,
        "framework": CUBLAS_WORKSPACE,
    }
    blank = {**common, **dict.fromkeys(STEP_COMPONENTS, 0)}
    out = MemoryStatics(opt=opt, sp=sp, fg=fg, common=common, blank=blank, common_total=sum(common.values()),
                        grads=grads, grads_prev=grads_prev,
                        grads_step=grads_step, ac=ac, ac_bwd=ac_bwd, head_deq=head_deq,
                        dequant=dequant_transient_bytes(model, setup, prof))
    run.memo["memory"] = out
    return out


@dataclass(frozen=True)
class MemoryAt:
    """Every instant's components at one shape (ints), or at every shape of a grid (numpy arrays).
    ``phases`` holds each instant's step components (``STEP_COMPONENTS``; one left out is 0); the persistent
    ones (``statics.common``) are the same at every instant: ``components`` and ``total`` add them."""

    phases: dict[str, dict[str, Any]]
    acts: ActivationPlan
    logits: LogitsPlan
    held: Any
    statics: MemoryStatics

    def components(self, phase: str) -> dict[str, Any]:
        """Every component of ``phase``, in display order."""
        return {**self.statics.blank, **self.phases[phase]}

    def total(self, phase: str) -> Any:
        """Bytes allocated at ``phase`` (exact: the components are ints, or int64 arrays)."""
        return self.statics.common_total + sum(self.phases[phase].values())


def memory_at(run: Run, batch: Any, seq: Any) -> MemoryAt:
    """The components live at each instant of the step at ``batch`` x ``seq``: Python ints, or numpy arrays
    broadcast together (a grid); the formulas are the same either way (``estimator/xp.py``)."""
    model, setup, prof, dt = run.model, run.setup, run.profile, run.dtypes
    st = memory_statics(run)
    sp = st.sp
    acts = activations_at(model, setup, dt, run.layers, batch, seq, gc_offload=prof.gc_offload,
                          quant_saves_input=prof.quant_saves_input, litgpt_code=prof.model_code == "litgpt",
                          quant_lm_head=prof.quantizes_lm_head, expand_kv=prof.model_code == "torchtune")
    tokens = batch * seq
    logit_bytes = dt.compute if dt.autocast else (dt.trainable if setup.method == "full" else dt.non_block)
    lg = logits_plan(tokens, model.head_width, logit_bytes, run.loss, seq, model.hidden,
                     softmax_keeps_input=setup.softmax_keeps_input)
    # What the training loop keeps between micro-batches (LitGPT: ``logits`` and ``loss`` stay bound until
    # the next micro-batch rebinds them; the loss's graph keeps bitsandbytes' pinned matmul inputs).
    held = lg.held if prof.loop_holds_outputs else 0
    pinned = acts.pinned_bytes
    first = setup.longest_batch_first
    prev_pinned = pinned if prof.loop_holds_outputs and not first else 0
    prev_held = 0 if first else held
    head_deq = st.head_deq
    fwd_logits = maximum(maximum(lg.forward_peak, prev_held + lg.cast_peak), prev_held + lg.at_forward_end + head_deq)
    grads, grads_prev = st.grads, st.grads_prev

    def phase(**extra: Any) -> dict[str, Any]:
        return extra  # the step components; MemoryAt.components adds the persistent ones

    fwd_acts = acts.saved_bytes
    # a quantized linear's dequantization scratch, live while the layer being back-propagated runs
    bwd_temp = acts.backward_temp_bytes + st.dequant
    phases: dict[str, dict[str, Any]] = {
        "forward": phase(gradients=grads_prev + sp.grad_buffers, activations=fwd_acts + prev_pinned,
                         autocast_copies=st.ac, logits_loss=fwd_logits, parallel_buffers=sp.gathered_at_forward_end),
        "backward_start": phase(gradients=grads_prev + sp.grad_buffers, activations=fwd_acts,
                                autocast_copies=st.ac_bwd, logits_loss=lg.backward_peak, parallel_buffers=sp.gathered_at_loss),
    }
    if head_deq:
        # the 4-bit lm_head's backward: every chunk's 16-bit logit gradient is ready (the loss backward ran
        # first), the held outputs, and the whole head dequantized again for the input gradient
        phases["backward_lm_head"] = phase(gradients=grads_prev + sp.grad_buffers, activations=fwd_acts,
                                           logits_loss=held + lg.at_forward_end + head_deq,
                                           parallel_buffers=sp.gathered)
    if setup.gradient_checkpointing:
        # the head and the final norm have been back-propagated (their saved tensors released) by the time
        # the top layer is recomputed (simulate: Llama-3.2-1B reward-model QLoRA)
        top = phase(gradients=grads_prev + sp.grad_buffers,
                    activations=fwd_acts - acts.tail_bytes + acts.recompute_bytes,
                    autocast_copies=st.ac_bwd, backward_temp=bwd_temp, parallel_buffers=sp.gathered)
        bottom = phase(gradients=grads + sp.grad_buffers, activations=acts.recompute_bytes,
                       backward_temp=bwd_temp, parallel_buffers=sp.gathered)
    else:
        top = phase(gradients=grads_prev + sp.grad_buffers, activations=fwd_acts, autocast_copies=st.ac,
                    backward_temp=bwd_temp, logits_loss=held, parallel_buffers=sp.gathered)
        # bitsandbytes' pinned inputs are not released as the layers are back-propagated
        bottom = phase(gradients=grads + sp.grad_buffers,
                       activations=acts.top_layer_bytes + pinned - pinned // max(model.n_layers, 1),
                       backward_temp=bwd_temp, logits_loss=held, parallel_buffers=sp.gathered)
    top["gradients"] += sp.transient_grad_buffers  # FSDP's reduce-scatter input, during a layer's backward
    bottom["gradients"] += sp.transient_grad_buffers - sp.grads_pending_bottom
    phases["backward_layers_top"] = top
    phases["backward_layers_bottom"] = bottom
    # Single GPU (checked against the simulate engine): the token-embedding gradient is the last one made,
    # so the bottom layer runs without it, and the embedding backward adds its scratch (tied weights: the
    # out-of-place sum of the lm_head and embedding contributions) on top of every gradient, with no
    # activation left (activations.embedding_backward). When a buffer is already there (a later micro-batch of
    # an accumulation, or keep_grads' zeroed buffer) the new gradient is a temporary that AccumulateGrad
    # adds into it in place (simulate: Qwen2.5-0.5B fp32 GA=2, +1 embedding-sized tensor).
    if acts.embedding_grad_bytes and setup.world_size == 1 and not setup.optimizer_in_backward:
        if setup.keep_grads or setup.grad_accum > 1:
            emb_temp = acts.embedding_backward_bytes + minimum(acts.embedding_grad_bytes, grads)
        else:
            bottom["gradients"] = bottom["gradients"] - minimum(acts.embedding_grad_bytes, grads)
            emb_temp = acts.embedding_backward_bytes
        phases["backward_embedding"] = phase(gradients=grads + sp.grad_buffers, backward_temp=emb_temp)
    if sp.end_of_backward is not None:  # FSDP2's embedding backward (estimator/parallel.fully_shard_terms)
        phases["backward_embedding"] = phase(gradients=grads + sp.grad_buffers + sp.end_of_backward[0],
                                             parallel_buffers=sp.end_of_backward[1])
    if first and setup.grad_accum > 1:
        # The micro-batch after the longest: gradients accumulated over the longest one, and (in a loop that
        # holds them) its outputs and pinned inputs; its own, shorter activations are not known: not counted
        phases["next_micro_batch"] = phase(
            gradients=(st.fg.accumulating if st.fg is not None else grads) + sp.grad_buffers,
            activations=pinned if prof.loop_holds_outputs else 0, logits_loss=held, parallel_buffers=sp.gathered)
    phases["optimizer_step"] = phase(gradients=st.grads_step + sp.grad_buffers,
                                     optimizer_temp=0 if setup.optimizer_in_backward else sp.optimizer_temp,
                                     activations=pinned if prof.loop_holds_outputs else 0, logits_loss=held)
    return MemoryAt(phases=phases, acts=acts, logits=lg, held=held, statics=st)


def memory_breakdown(model: ModelSpec, setup: TrainSetup) -> MemoryBreakdown:
    """Analytic per-GPU memory of ``setup`` (already resolved against its profile)."""
    return memory_of(resolve_run(model, setup))


def memory_of(run: Run) -> MemoryBreakdown:
    """Analytic per-GPU memory of a resolved run at its own batch and seq: the instant with the largest
    allocated total (the first one on a tie), its components, the reserved and device figures."""
    setup, prof = run.setup, run.profile
    m = memory_at(run, setup.batch, setup.seq)
    # Python ints at one shape (activations_at truncates its float sums): the totals are exact in any order
    base = m.statics.common_total
    totals = {k: base + sum(v.values()) for k, v in m.phases.items()}
    peak = max(totals, key=totals.__getitem__)
    comps = m.components(peak)
    allocated = totals[peak]
    reserved = reserved_from_allocated(allocated)
    transient = comps["activations"] + comps["logits_loss"] + comps["backward_temp"]
    bands = {
        "allocated": Band(int(allocated - ACTIVATION_BAND * transient), int(allocated + ACTIVATION_BAND * transient),
                          "activation and loss terms +-10% (saved-tensor model)"),
        "reserved": Band(int(allocated * (1 + FRAGMENTATION_BAND[0])), int(allocated * (1 + FRAGMENTATION_BAND[1])),
                         "caching-allocator fragmentation (emulated, not yet measured on GPU)"),
        "cuda_context": CUDA_CONTEXT,
    }
    st, acts, held = m.statics, m.acts, m.held
    pinned, head_deq = acts.pinned_bytes, st.head_deq
    notes = list(st.sp.notes) + list(st.opt.notes)
    if acts.offloaded_bytes:
        notes.append(f"{acts.offloaded_bytes / 2**30:.2f} GiB of saved activations offloaded to CPU")
    if held:
        notes.append(f"{prof.label}: the training loop keeps the last micro-batch's logits ({held / 2**30:.2f} GiB) "
                     "through backward, the optimizer step and the next forward")
    if pinned and prof.loop_holds_outputs:
        notes.append(f"bitsandbytes <= 0.43 keeps every 4-bit matmul input ({pinned / 2**30:.2f} GiB) for as long "
                     "as the loss's graph lives (the next micro-batch's forward included)")
    if head_deq:
        notes.append(f"the 4-bit lm_head dequantizes its whole weight for every chunk ({head_deq / 2**30:.2f} GiB live)")
    return MemoryBreakdown(
        components=comps, peak_phase=peak, phases=totals, reserved_peak_bytes=reserved,
        cuda_context_bytes=cuda_context_bytes(), nccl_bytes=st.sp.nccl, paged_bytes=st.opt.paged,
        host_bytes=st.sp.host + acts.offloaded_bytes, engine="analytic", bands=bands, notes=notes,
    )
