"""The card's rates for the time model: the dense tensor peak of the matmul dtype and the fractions of the
tensor peak and of the memory bandwidth a training step's kernels reach (``throughput.py`` says how they
are used; ``gemm_efficiency.py`` holds the per-card figures where a measurement exists)."""

from __future__ import annotations

from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.setup import TrainSetup

# Achievable fraction of the dense tensor peak for the large GEMMs of a training step, by card class.
# cuBLAS reaches about 80% of the dense bf16/fp16 peak on large square GEMMs on V100/A100/Ada/GA102
# (NVIDIA "Matrix Multiplication Background" user guide, fig. "performance of GEMMs"; A100 ~250 of 312
# TFLOPS); Hopper reaches a smaller fraction of its larger peak with cuBLAS (~65-70%: the FP8/BF16 GEMM
# results in NVIDIA's H100 tuning guide and PyTorch's Hopper GEMM benchmarks); AMD Instinct's hipBLASLt
# reaches about half of the marketed peak (SemiAnalysis MI300X vs H100 benchmark, Dec 2024).
# Ada (compute capability 8.9): cuBLAS HGEMM on an L20 (AD102, 119.5 TFLOPS dense fp16 tensor peak) runs
# 105-115 TFLOPS on large shapes (DefTruth/CUDA-Learn-Notes hgemm README, measured against cuBLAS): ~0.92.
GEMM_EFFICIENCY = {"nvidia-hbm": 0.80, "nvidia-gddr": 0.80, "nvidia-ada": 0.92, "nvidia-hopper": 0.68,
                   "amd": 0.50, "other": 0.50}
# Achievable fraction of peak memory bandwidth for streaming element-wise kernels (STREAM-like copies
# reach 85-90% on A100/H100 HBM, ~85% on GDDR6X; element-wise PyTorch kernels with broadcasting and
# reductions are lower): one value for all cards.
BW_EFFICIENCY = 0.70
# torch.compile / hand-fused kernels (Unsloth's Triton RMSNorm, RoPE, SwiGLU, fused loss) write fewer
# intermediates: element-wise traffic and launched kernels scale by these factors (chosen, not measured:
# fusion removes most intermediate writes of a norm / rotary / gated-activation chain).
FUSED_TRAFFIC = 0.5
FUSED_OPS = 0.3


def card_class(acc: Accelerator) -> str:
    """The row of ``GEMM_EFFICIENCY`` the card falls in (vendor, memory kind, compute capability)."""
    if acc.vendor == "AMD":
        return "amd"
    if acc.vendor != "NVIDIA":
        return "other"
    if acc.compute_capability and acc.compute_capability >= (9, 0) and "HBM" in (acc.memory_type or ""):
        return "nvidia-hopper"
    if acc.compute_capability == (8, 9):
        return "nvidia-ada"
    return "nvidia-hbm" if "HBM" in (acc.memory_type or "") else "nvidia-gddr"


def matmul_peak_tflops(acc: Accelerator, setup: TrainSetup) -> float | None:
    """Dense tensor peak for the matmul dtype. fp16 GEMMs in PyTorch accumulate in fp32, which runs at the
    bf16 rate (consumer cards halve fp16-with-fp16-accumulate figures for fp32 accumulation); fp32 runs on
    CUDA cores (PyTorch's default ``allow_tf32=False`` for matmuls since 1.12)."""
    per_package = acc.fp32_tflops if setup.precision == "fp32" else (acc.bf16_tflops_dense
                                                                      or acc.fp16_fp16acc_tflops_dense)
    if not per_package and (acc.tensor_cores or "").lower().startswith("no"):
        # No tensor cores (Pascal and older): PyTorch's 16-bit GEMMs ask cuBLAS for fp32 accumulation
        # (CUBLAS_COMPUTE_32F), which runs on the fp32 units at the fp32 rate.
        per_package = acc.fp32_tflops
    # one device of a multi-device package (MI250X: 2 GCDs) gets its share of the package's figure
    return per_package / max(1, acc.devices_per_package) if per_package else None
