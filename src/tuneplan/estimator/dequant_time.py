"""Time of rebuilding 16-bit weights from quantized ones before each matmul (QLoRA): bytes per weight
element at peak bandwidth, kernels per rebuild, and which library's kernels do it."""

from __future__ import annotations

from tuneplan.estimator.card_rates import BW_EFFICIENCY
from tuneplan.specs.setup import TrainSetup

# bitsandbytes dequantize_4bit reads 0.5 B (+ absmax, ~0.03 B with double quantization) and writes 2 B per
# weight, then the GEMM reads the 16-bit copy once more (2 B). Until bitsandbytes 0.48 its kernel decoded NF4
# with branches and ran below bandwidth: the branch-free lookup-table kernel that replaced it (PR #1746,
# Sept 2025) measured 1.36-2.07x faster on A100 / H100 (PR #1747's benchmarks of the same change), so the
# kernel of the published runs takes ~2x its traffic time. Per weight per pass, at peak bandwidth:
# (2.5 x 2 + 2) / BW_EFFICIENCY = 10 B. (Kept for current versions too: a conservative choice.)
DEQUANT_KERNEL_BYTES = 2.5
BNB_BRANCHY_KERNEL_SLOWDOWN = 2.0
DEQUANT_COPY_READ_BYTES = 2.0
DEQUANT_BYTES_PER_WEIGHT = ((DEQUANT_KERNEL_BYTES * BNB_BRANCHY_KERNEL_SLOWDOWN + DEQUANT_COPY_READ_BYTES)
                            / BW_EFFICIENCY)
# torchao NF4Tensor (torchtune's QLoRA, torchao/dtypes/nf4tensor.py) rebuilds the weight with PyTorch ops,
# ``get_original_weight``; per weight element (n/2 packed bytes hold n codes), eager:
#   ``>> 4`` and ``& 0b1111`` read 0.5 B and write 0.5 B each; each ``.to(torch.long)`` reads those 0.5 B
#   and writes 4 B; each table lookup ``nf4[codes]`` reads 4 B, writes 1 B (bf16, half the elements);
#   ``repeated.flatten()`` copies the expanded scalers twice (1 B written each); each scaling multiply
#   reads 1 + 1 B, writes 1 B; ``torch.stack`` reads 2 B, writes 2 B:
#   17 B written + 16 B read = 33 B, in 11 kernels plus the scalers' own dequantization (~4 more).
# Under torch.compile one fused kernel reads the codes and writes the 16-bit weight (0.5 + 2 B). Either
# way the GEMM then reads the 16-bit copy (2 B). No branchy bitsandbytes kernel in that path.
TORCHAO_EAGER_DEQUANT_BYTES = 33.0
TORCHAO_EAGER_DEQUANT_KERNELS = 15
TORCHAO_COMPILED_DEQUANT_BYTES = 0.5 + 2.0
# LLM.int8 (8-bit) matmuls decompose outliers and run int8 GEMMs; much slower than 4-bit dequant in
# practice (bitsandbytes README: "8-bit ... slower"); modeled as twice the 4-bit pass (assumption).
INT8_DEQUANT_FACTOR = 2.0


def dequant_bytes_per_weight(setup: TrainSetup, model_code: str, compiled: bool) -> float:
    """Bytes per weight element and dequantization pass, at peak bandwidth (the kernel's traffic divided by
    ``BW_EFFICIENCY``): torchao's NF4 for torchtune's model code, else bitsandbytes (see the constants)."""
    if model_code == "torchtune" and setup.quant_bits == 4:
        kernel = TORCHAO_COMPILED_DEQUANT_BYTES if compiled else TORCHAO_EAGER_DEQUANT_BYTES
        return (kernel + DEQUANT_COPY_READ_BYTES) / BW_EFFICIENCY
    return DEQUANT_BYTES_PER_WEIGHT * (INT8_DEQUANT_FACTOR if setup.quant_bits == 8 else 1.0)


def dequant_library(setup: TrainSetup, model_code: str) -> str:
    """The library whose kernels rebuild a quantized run's 16-bit weights (``dequant_bytes_per_weight``)."""
    return "torchao NF4" if model_code == "torchtune" and setup.quant_bits == 4 else "bitsandbytes"


def kernels_per_dequant(setup: TrainSetup, model_code: str, compiled: bool) -> int:
    """Kernels one dequantization of one weight launches: bitsandbytes' ``dequantize_4bit`` and a compiled
    torchao kernel 1, eager torchao's ``get_original_weight`` ~15 (``TORCHAO_EAGER_DEQUANT_KERNELS``)."""
    eager_torchao = model_code == "torchtune" and setup.quant_bits == 4 and not compiled
    return TORCHAO_EAGER_DEQUANT_KERNELS if eager_torchao else 1
