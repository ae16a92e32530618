"""From the tracker's event log to the MemoryBreakdown every engine returns, plus the simulate details."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tuneplan.estimator.memory import CUDA_CONTEXT
from tuneplan.estimator.overhead import cuda_context_bytes
from tuneplan.estimator.types import COMPONENTS, Band, MemoryBreakdown
from tuneplan.estimator.wrappers.base import NCCL_BYTES

# The allocator emulation's reserved peak against five published GPU runs came within -4.9% .. +1.4% of
# max_memory_reserved (simulation-feasibility notes, "Later check against real GPUs").
RESERVED_BAND = (-0.05, 0.02)
LIMITS = (
    "simulate: eager PyTorch only (no torch.compile); no data-dependent shapes (MoE eager expert loops, "
    "unpadded varlen attention); batches without padding; kernels without a stand-in (Liger, Unsloth, "
    "DeepSpeed) are not simulated; CPU autocast with CUDA autocast's fp32 op list stands in for CUDA "
    "autocast",
)

PHASE_NAMES = {"forward": "forward", "backward": "backward", "optimizer": "optimizer_step",
               "zero_grad": "optimizer_step"}


@dataclass
class SimulationReport:
    breakdown: MemoryBreakdown
    peak_op: str = ""
    peak_module: str = ""
    peak_step: int = 2
    by_module: list[tuple[str, int]] = field(default_factory=list)
    top_tensors: list[dict[str, Any]] = field(default_factory=list)
    workspaces: list[dict[str, Any]] = field(default_factory=list)
    allocator: dict[str, Any] = field(default_factory=dict)
    step_peaks: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    build_seconds: float = 0.0
    fallback: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_op": self.peak_op, "peak_module": self.peak_module, "peak_step": self.peak_step,
            "by_category": dict(self.breakdown.components),
            "by_module": [{"module": m, "bytes": b} for m, b in self.by_module],
            "top_tensors": self.top_tensors, "kernel_workspaces": self.workspaces,
            "allocator_emulation": self.allocator, "step_peaks": self.step_peaks,
            "outside_pytorch": {"cuda_context_bytes": self.breakdown.cuda_context_bytes,
                                "nccl_bytes": self.breakdown.nccl_bytes},
            "seconds": round(self.seconds, 2), "build_seconds": round(self.build_seconds, 2),
            "fallback": self.fallback, "wrapper": self.breakdown.wrapper,
        }


_LAYER = re.compile(r"^((?:.*?\.)?(?:layers|layer|h|blocks)\.\d+)")  # Llama ``layers.N``, BERT ``layer.N``, GPT-2 ``h.N``


def module_group(name: str) -> str:
    """Collapse a module path to its decoder layer (or the top-level module outside the layers)."""
    if not name:
        return "(autograd engine: backward)"
    if name == "base_model.model" or name.endswith(("ForCausalLM", "ForMaskedLM", "ForSequenceClassification")):
        return "(loss, in the model's head forward)"
    name = name.replace("base_model.model.", "")
    m = _LAYER.match(name)
    return m.group(1) if m else name


def host_peak(res: Any) -> int:
    """Peak of the blocks filed as host memory (CPU-offloaded parameters, gradients, optimizer states)."""
    cur = best = 0
    for ev in res.events:
        if ev.block.category == "host":
            cur += ev.block.size if ev.alloc else -ev.block.size
            best = max(best, cur)
    return best


def stream_gap(res: Any, alloc: Any, capacity: int | None) -> dict[str, Any]:
    """The reserved-vs-allocated gap of the run and its cross-stream part.

    ``alloc`` is the emulation with the allocator's stream rules (``allocator.replay``: pools per stream,
    ``record_stream`` frees returned once the CPU has waited for work queued after them). The same events
    replayed on one stream give the reserved peak without them; the difference is the cross-stream caching
    (0 for a run whose blocks all live on the compute stream: every single-GPU run). A replay whose pending
    frees return at the next allocation (a GPU that keeps up with the CPU) gives the low end."""
    from tuneplan.simulate.allocator import replay

    st = alloc.stats
    by_stream = dict(sorted(st.reserved_by_stream_at_peak.items()))
    if len(by_stream) > 1 or st.deferred_frees:
        one = replay(res.events, capacity, streams=False).stats.max_reserved
        keeps_up = replay(res.events, capacity, res.stream_ops, complete="eager").stats.max_reserved
    else:
        one = keeps_up = st.max_reserved
    return {"reserved_bytes": st.max_reserved, "allocated_bytes": st.max_allocated,
            "gap_bytes": st.max_reserved - st.max_allocated,
            "cross_stream_bytes": max(0, st.max_reserved - one), "reserved_one_stream_bytes": one,
            "reserved_gpu_keeps_up_bytes": keeps_up, "reserved_by_stream_bytes": by_stream,
            "pending_cross_stream_at_peak_bytes": st.pending_at_peak, "deferred_frees": st.deferred_frees}


def build_report(run: Any, capacity: int | None = None, snapshot_path: str | None = None) -> SimulationReport:
    from tuneplan.simulate.allocator import replay
    from tuneplan.simulate.tracker import find_peak

    res = run.result
    pk = find_peak(res)
    comps = {k: 0 for k in COMPONENTS}
    groups: dict[str, int] = {}
    for b in pk.live:
        comps[b.category if b.category in comps else "framework"] += b.size
        g = module_group(b.module) if b.category in ("activations", "autocast_copies", "logits_loss",
                                                      "backward_temp") else b.category
        groups[g] = groups.get(g, 0) + b.size
    step = pk.phase.split(".")[0] if "." in pk.phase else "step2"
    last = max((int(p[4:].split(".")[0]) for p in pk.phase_peaks if p.startswith("step")), default=2)
    instants: dict[str, int] = {}
    for name, v in pk.phase_peaks.items():
        if not name.startswith(f"step{last}."):
            continue
        key = PHASE_NAMES.get(name.split(".")[1], name)
        instants[key] = max(instants.get(key, 0), v)
    peak_instant = PHASE_NAMES.get(pk.phase.split(".")[-1], pk.phase)
    if step != f"step{last}":
        peak_instant = f"{step}.{peak_instant}"
    step_peaks = {}
    for name, v in pk.phase_peaks.items():
        s = name.split(".")[0]
        step_peaks[s] = max(step_peaks.get(s, 0), v)

    alloc = replay(res.events, capacity, res.stream_ops)
    st = alloc.stats
    if snapshot_path:
        from tuneplan.simulate.snapshot import write_snapshot

        write_snapshot(snapshot_path, alloc, res.blocks)
    gap = stream_gap(res, alloc, capacity)
    reserved = st.max_reserved
    allocated = sum(comps.values())
    notes = [f"peak op: {pk.op.replace('aten.', '')} in {pk.module or '(autograd)'} ({peak_instant})",
             "reserved is an emulation of the CUDA caching allocator, not yet confirmed by GPU measurements",
             *run.notes, *LIMITS]
    bands = {
        "allocated": Band(allocated, allocated,
                          "exact for the simulated code path; kernel workspaces not in the table are missed"),
        "reserved": Band(int(gap["reserved_gpu_keeps_up_bytes"] * (1 + RESERVED_BAND[0])),
                         int(reserved * (1 + RESERVED_BAND[1])),
                         "caching-allocator emulation (checked on 5 published GPU runs: -4.9%..+1.4%)"
                         + ("; low end: a GPU that keeps up with the CPU (pending cross-stream frees returned at "
                            "once)" if gap["cross_stream_bytes"] else "")),
        "cuda_context": CUDA_CONTEXT,
    }
    wrapper = getattr(run, "wrapper", "")
    if wrapper:
        notes.insert(0, f"simulate: wrapper that ran: {wrapper}")
    if len(gap["reserved_by_stream_bytes"]) > 1:
        notes.insert(1, f"reserved - allocated: {gap['gap_bytes'] / 2**30:.2f} GiB, of which "
                        f"{gap['cross_stream_bytes'] / 2**30:.2f} GiB is caching per CUDA stream "
                        f"({len(gap['reserved_by_stream_bytes'])} streams: blocks cached by one stream are not "
                        "reused by another; record_stream defers a block's reuse)")
    bd = MemoryBreakdown(components=comps, peak_instant=peak_instant, instants=instants,
                         reserved_peak_bytes=max(reserved, allocated), cuda_context_bytes=cuda_context_bytes(),
                         nccl_bytes=NCCL_BYTES if getattr(run, "world_size", 1) > 1 else 0,
                         paged_bytes=run.paged_bytes, host_bytes=host_peak(res), engine="simulate", bands=bands,
                         notes=notes, wrapper=wrapper)
    top = sorted(pk.live, key=lambda b: -b.size)[:10]
    return SimulationReport(
        breakdown=bd, peak_op=pk.op.replace("aten.", ""), peak_module=pk.module,
        peak_step=int(step[4:]) if step.startswith("step") else 2,
        by_module=sorted(groups.items(), key=lambda kv: -kv[1])[:12],
        top_tensors=[{"category": b.category, "module": b.module.replace("base_model.model.", ""),
                      "op": b.op.replace("aten.", ""),
                      "shape": list(b.shape), "dtype": b.dtype, "bytes": b.size, "phase": b.phase} for b in top],
        workspaces=[{"name": n, "op": o.replace("aten.", ""), "bytes": s} for n, o, s in res.workspaces]
        + [{"name": n, "op": "stand-in kernel", "bytes": s} for n, s in run.kernel_buffers.items()],
        allocator={"emulated": True, "max_allocated_bytes": st.max_allocated, "max_reserved_bytes": st.max_reserved,
                   "max_requested_bytes": st.max_requested, "segments_at_reserved_peak": st.segments_at_peak,
                   "cuda_mallocs": st.cuda_mallocs, "cuda_frees": st.cuda_frees, "capacity_bytes": capacity,
                   "would_oom": st.oom, **gap},
        step_peaks=step_peaks, seconds=run.seconds, build_seconds=run.build_seconds,
    )
