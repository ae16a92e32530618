"""What the allocator and the driver add on top of PyTorch's allocated bytes.

- cuBLAS workspace: allocated through PyTorch's caching allocator (counted as allocated); the default
  ``CUBLAS_WORKSPACE_CONFIG`` is ``:4096:8`` (8 x 4 MiB) on pre-Hopper cards and ``:4096:2:16:8`` on
  Hopper (PyTorch docs, "Reproducibility" / cuBLAS workspaces).
- reserved vs allocated: the caching allocator rounds blocks to 512 B and carves them from 2 MiB
  (small) or 20 MiB / exact (large) segments; fragmentation leaves freed blocks that cannot be reused.
  Modelled as a fraction of the allocated peak (an emulation, to be confirmed by measured runs), with a
  band.
- CUDA context: driver, kernels and the CUDA runtime outside PyTorch: 300 MiB to 2 GiB depending on
  GPU, driver and lazy loading (prior-art e.6); the calibration rows read through NVML on a V100 give
  ~1343 MB with an older stack. Modern PyTorch (CUDA >= 11.7 lazy module loading) is ~0.5 GiB.
"""

from __future__ import annotations

from typing import Any

from tuneplan.estimator.xp import to_int

MIB = 1024**2
CUBLAS_WORKSPACE = 32 * MIB  # 8 x 4 MiB (:4096:8)
FRAGMENTATION = 0.06  # reserved / allocated - 1 at the peak of a steady training step (central value)
FRAGMENTATION_BAND = (0.02, 0.20)
CUDA_CONTEXT = 512 * MIB
CUDA_CONTEXT_BAND = (300 * MIB, 1400 * MIB)
SEGMENT = 2 * MIB


def reserved_from_allocated(allocated: Any) -> Any:
    """allocated x (1 + FRAGMENTATION), truncated to bytes, rounded up to whole 2 MiB segments (an int, or an
    array of a grid: ``estimator/xp.py``)."""
    r = to_int(allocated * (1 + FRAGMENTATION))
    return -(-r // SEGMENT) * SEGMENT


def reserved_band(allocated: Any) -> tuple[Any, Any]:
    """The reserved figure's band: allocated x (1 + FRAGMENTATION_BAND), each end truncated to bytes (ints, or
    arrays of a grid: the planner reads the high end off every cell)."""
    return (to_int(allocated * (1 + FRAGMENTATION_BAND[0])), to_int(allocated * (1 + FRAGMENTATION_BAND[1])))


def cuda_context_bytes(vendor: str | None = None) -> int:
    return CUDA_CONTEXT
