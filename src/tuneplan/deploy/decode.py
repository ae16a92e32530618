"""An upper bound on decode speed: bytes each step must read, and the batch where compute takes over.

Each decode step makes one token for each of ``B`` sequences. It must read, per GPU:
- the weights the step multiplies with: every block weight once (all ``B`` tokens share the read), the
  output matrix, not the embedding table (a lookup reads ``B`` rows) unless it is tied to the output;
  MoE routed experts only where some token of the batch goes: with uniform routing ``E (1 - (1 - k/E)^B)``
  of the ``E`` experts of a layer (at ``B = 1``, the ``k`` a token visits);
- each sequence's KV cache for its whole context;
- an unmerged LoRA adapter, like any weight.
Memory time is those bytes over the card's memory bandwidth; compute time is ``B`` times the forward FLOPs
of one token at this context (``tuneplan.estimator.compute.flops_per_token``) over the dense 16-bit
tensor throughput (weight-only int4/int8 kernels dequantize to 16 bits and multiply there). A step takes at
least the larger of the two, so tokens/s per sequence is at most ``1 / max``. It is a bound: kernel
efficiency, launch overheads, sampling, and tensor-parallel all-reduces make real engines slower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneplan.deploy.kv_cache import KvLayout
from tuneplan.deploy.weights import WeightBytes
from tuneplan.estimator.compute import flops_per_token
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

MAX_BATCH = 1 << 20  # search bound for the compute crossover


@dataclass(frozen=True)
class DecodeInputs:
    weights_read_dense: float  # bytes per step per GPU that do not depend on the batch
    experts_bytes: float  # all routed experts' bytes per GPU
    experts: int
    top_k: int
    kv_per_seq: float  # bytes of one sequence's cache per GPU at the context
    flops_per_token: float  # forward FLOPs of one token, whole model
    adapter_flops: float
    tp: int


def decode_inputs(model: ModelSpec, setup: TrainSetup, weights: WeightBytes, kv: KvLayout, *, context: int,
                  tp: int, adapter_bytes: int, unmerged: bool) -> DecodeInputs:
    per_gpu = weights.per_gpu(tp)
    experts = weights.expert_bytes / tp
    embed_skip = 0.0 if model.tied_embeddings else weights.embedding / tp
    dense = per_gpu - experts - embed_skip + adapter_bytes
    # At position `context` a query meets `context` keys; compute.py averages (s+1)/2 over a causal
    # sequence of s, so s = 2*context - 1 gives the last token's attention work.
    fsetup = setup.replace(attn="sdpa", method=setup.method if unmerged and setup.is_lora else "full",
                           gradient_checkpointing=False)
    f = flops_per_token(model, fsetup, seq=2 * context - 1)
    fwd = f.parts["linear_fwd"] + f.parts["attn_fwd"] + f.parts["logits_fwd"]
    ada = f.parts["adapter_fwd"] if unmerged else 0.0
    return DecodeInputs(weights_read_dense=dense, experts_bytes=experts, experts=model.n_experts,
                        top_k=model.top_k, kv_per_seq=kv.bytes_for(context), flops_per_token=fwd + ada,
                        adapter_flops=ada, tp=tp)


def _bytes_read(d: DecodeInputs, batch: int) -> float:
    touched = 1.0
    if d.experts:
        touched = 1.0 - (1.0 - min(d.top_k, d.experts) / d.experts) ** batch
    return d.weights_read_dense + d.experts_bytes * touched + batch * d.kv_per_seq


def step_times(d: DecodeInputs, acc: Accelerator, batch: int) -> tuple[float, float] | None:
    """(memory seconds, compute seconds) of one decode step, or None when the card lacks the figures."""
    # catalog figures are per package; a multi-die card (MI250X) serves from one device
    devices = max(1, acc.devices_per_package)
    bw = (acc.memory_bandwidth_gbs or 0) * 1e9 / devices
    peak = (acc.bf16_tflops_dense or acc.fp16_fp16acc_tflops_dense or 0) * 1e12 / devices
    if bw <= 0 or peak <= 0:
        return None
    return _bytes_read(d, batch) / bw, batch * d.flops_per_token / d.tp / peak


def crossover_batch(d: DecodeInputs, acc: Accelerator) -> int | None:
    """Smallest batch whose step is compute-bound, or None if memory stays the limit up to MAX_BATCH."""
    t = step_times(d, acc, MAX_BATCH)
    if t is None or t[1] < t[0]:
        return None
    lo, hi = 1, MAX_BATCH
    while lo < hi:
        mid = (lo + hi) // 2
        mem, cmp_ = step_times(d, acc, mid) or (0.0, 0.0)
        if cmp_ >= mem:
            hi = mid
        else:
            lo = mid + 1
    return lo


def decode_bound(d: DecodeInputs, acc: Accelerator, batch: int) -> dict[str, Any] | None:
    t = step_times(d, acc, batch)
    if t is None:
        return None
    mem, cmp_ = t
    step = max(mem, cmp_)
    return {"batch": batch, "bytes_read_per_step": _bytes_read(d, batch), "memory_s": mem, "compute_s": cmp_,
            "bound_by": "memory bandwidth" if mem >= cmp_ else "compute",
            "tokens_per_s_per_sequence": 1.0 / step, "tokens_per_s_total": batch / step}
