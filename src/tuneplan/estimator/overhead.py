"""What the allocator and the driver add on top of PyTorch's allocated bytes.

- cuBLAS workspace: allocated through PyTorch's caching allocator (counted as allocated); the default
  ``CUBLAS_WORKSPACE_CONFIG`` is ``:4096:8`` (8 x 4 MiB) on pre-Hopper cards and ``:4096:2:16:8`` on
  Hopper (PyTorch docs, "Reproducibility" / cuBLAS workspaces).
- reserved vs allocated: the caching allocator rounds blocks to 512 B and carves them from 2 MiB
  (small) or 20 MiB / exact (large) segments. The free segments a step strands at the loss (the layers'
  forward blocks, the 16-bit logits, which the loss chain's larger fp32 blocks cannot reuse) come from
  ``allocator_segments.py``; the tails of split segments are a fraction of the allocated peak
  (``FRAGMENTATION``, not modelled block by block); plus what sharded runs cache per CUDA stream
  (:func:`cross_stream_reserve`). An emulation of the allocator's rules, to be confirmed by measured runs.
- CUDA context: driver, kernels and the CUDA runtime outside PyTorch: 300 MiB to 2 GiB depending on
  GPU, driver and lazy loading (prior-art e.6); the calibration rows read through NVML on a V100 give
  ~1343 MB with an older stack. Modern PyTorch (CUDA >= 11.7 lazy module loading) is ~0.5 GiB.
"""

from __future__ import annotations

from typing import Any

from tuneplan.estimator.xp import to_int

MIB = 1024**2
CUBLAS_WORKSPACE = 32 * MIB  # 8 x 4 MiB (:4096:8)
# the tails of split segments at the allocated peak, as a share of it: reserved / allocated - 1 of a step
# whose peak strands no whole segment (the flat figure this model had before the stranded segments; the
# allocator emulation replaying simulate's trace gives 5.8 % for Qwen2.5-0.5B at 4 layers, full
# fine-tune, 2 x 1024 tokens, whose peak strands none)
FRAGMENTATION = 0.06
# the reserved band: the low end is what the allocator still needs once a failed cudaMalloc has released
# every free cached segment (release_cached_blocks); the high end lies this far above allocated x (1 + low)
FRAGMENTATION_BAND = (0.02, 0.20)
CUDA_CONTEXT = 512 * MIB
CUDA_CONTEXT_BAND = (300 * MIB, 1400 * MIB)
SEGMENT = 2 * MIB


def reserved_band(allocated: Any, reserved: Any, cross_stream: int = 0) -> tuple[Any, Any]:
    """The reserved figure's band around ``reserved`` (allocator_segments.reserved_figures, ``cross_stream``
    included): allocated x (1 + FRAGMENTATION_BAND[0]) up to ``reserved`` + allocated x (FRAGMENTATION_BAND[1]
    - FRAGMENTATION), each truncated to bytes, plus the bytes cached per CUDA stream at the low end (ints, or
    arrays of a grid: the planner reads the high end off each cell)."""
    return (to_int(allocated * (1 + FRAGMENTATION_BAND[0])) + cross_stream,
            reserved + to_int(allocated * (FRAGMENTATION_BAND[1] - FRAGMENTATION)))


def device_peak_high(allocated: Any, reserved: Any, device_peak: Any) -> Any:
    """The device peak's upper band from a grid's arrays, element-wise (as ``MemoryBreakdown.
    device_peak_high_bytes`` reads it off one breakdown's bands): the reserved band's high end, the CUDA
    context band's high end, and NCCL (no band), which is what the device peak holds above reserved +
    context."""
    nccl = device_peak - reserved - cuda_context_bytes()
    return reserved_band(allocated, reserved)[1] + CUDA_CONTEXT_BAND[1] + nccl


# FSDP1 ``limit_all_gathers``: ``_FreeEventQueue._max_num_inflight_all_gathers`` (torch/distributed/fsdp/
# _limiter_utils.py): the CPU runs at most this many freed unsharded units ahead of the compute stream
FSDP1_INFLIGHT = 2
# FSDP2: the next group's all-gather is issued before the current group's copy-out (forward and backward
# prefetch), so its copy-in stream holds two flat all-gather outputs (_fsdp_collectives.foreach_all_gather)
FSDP2_ALL_GATHER_OUTPUTS = 2


def cross_stream_reserve(run: Any) -> int:
    """Bytes a sharded run keeps reserved in one CUDA stream's pool that another stream's requests cannot
    use, at the allocated peak (the caching allocator's per-stream pools and ``record_stream``,
    c10/cuda/CUDACachingAllocator.cpp; simulate's allocator emulation replays them on the traced run).

    With ``u`` one decoder layer unsharded as the wrapper gathers it (16-bit, or packed 4/8-bit codes as
    stored) and ``g`` the unsharded gradient a trainable unit reduce-scatters
    (``wrappers.fsdp.fsdp_reduce_scatter_input``):
    - FSDP1: the unshard stream allocates each unit's unsharded flat parameter; ``_free_unsharded_flat_param``
      records it on the compute stream, so a freed unit returns to the unshard stream's pool only once the
      compute stream has passed it, which the CPU learns from the rate limiter's event, ``FSDP1_INFLIGHT``
      units later: ``FSDP1_INFLIGHT x u`` freed but held. The post-backward hook records the autograd
      gradient on the post-backward stream before freeing it (``_runtime_utils._post_backward_hook``):
      ``FSDP1_INFLIGHT x g`` held in the compute stream's pool through the backward; with CPU offload and
      ``use_orig_params=False``, the pre-unshard stream's copies of host shards
      (``wrappers.fsdp1_offload.freed_shard_copies``);
    - FSDP2 (no ``record_stream``): the copy-in stream caches ``FSDP2_ALL_GATHER_OUTPUTS`` flat all-gather
      outputs the compute stream cannot reuse, and the reduce-scatter stream the reduce-scatter input it
      keeps until the next group's (``reduce_scatter_state``): ``2 x u + g``;
    - one GPU, DDP, DeepSpeed: 0 (every block on the compute stream; DeepSpeed's own streams are not
      emulated).
    Against simulate's emulation (Llama-2-7B, seq 512): FSDP1 LoRA 2 GPUs 0.75 GiB here vs 0.32 GiB in the
    trace, FSDP1 full 4 GPUs 1.5 vs 2.5, FSDP2 LoRA 0.75 vs 0.76, FSDP2 full 1.1 vs 0.8 (the trace's reserved
    less allocated x (1 + FRAGMENTATION))."""
    setup = run.setup
    if not setup.fsdp or setup.world_size < 2:
        return 0
    cached: int | None = run.memo.get("cross_stream")
    if cached is not None:
        return cached
    from tuneplan.estimator.wrappers.fsdp import fsdp_reduce_scatter_input
    from tuneplan.estimator.wrappers.fsdp1_offload import freed_shard_copies

    model, pp, compute = run.model, run.param_plan, run.dtypes.compute
    u = model.largest_layer_params * compute
    if setup.quant_bits is not None and pp.largest_layer_bytes:
        u = min(u, pp.largest_layer_bytes)
    g = fsdp_reduce_scatter_input(run)
    out: int = (FSDP1_INFLIGHT * (u + g) + freed_shard_copies(run) if setup.fsdp_version == 1
           else FSDP2_ALL_GATHER_OUTPUTS * u + g)
    run.memo["cross_stream"] = out
    return out


def cuda_context_bytes(vendor: str | None = None) -> int:
    return CUDA_CONTEXT
