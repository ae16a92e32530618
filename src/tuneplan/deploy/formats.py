"""Serving weight formats and the exact bytes each one stores for a weight matrix.

A linear weight is ``d_out x d_in`` (rows x reduction dim, as transformers stores ``nn.Linear.weight``).
Layouts, from each format's reference implementation:
- 16-bit (safetensors bf16/fp16): 2 B per element.
- bitsandbytes NF4 / LLM.int8: exactly the storage the training estimator counts
  (``tuneplan.estimator.weights.quant_bytes``: NF4 0.5 B + fp32 absmax per 64, nested 8-bit absmax per 256
  blocks under double quant, the per-tensor code tables; int8 1 B + one fp32 scale per output row, ``SCB``).
- GPTQ (AutoGPTQ / GPTQModel ``QuantLinear``, the checkpoint vLLM's gptq/marlin kernels read), ``bits`` b,
  group g (128): ``qweight`` int32 ``[d_in*b/32, d_out]``, ``qzeros`` int32 ``[ceil(d_in/g), d_out*b/32]``,
  ``scales`` fp16 ``[ceil(d_in/g), d_out]``, ``g_idx`` int32 ``[d_in]``; bias fp16.
- AWQ (AutoAWQ GEMM ``WQLinear_GEMM``), 4-bit, group 128: ``qweight`` int32 ``[d_in, d_out/8]``,
  ``qzeros`` int32 ``[ceil(d_in/g), d_out/8]``, ``scales`` fp16 ``[ceil(d_in/g), d_out]``; no ``g_idx``.
- GGUF (ggml ``ggml-common.h`` block structs), a row of ``d_in`` elements in blocks:
  Q8_0 32 el / 34 B (fp16 d + 32 int8); Q4_0 32 / 18 B (fp16 d + 16 B of nibbles);
  Q5_0 32 / 22 B (fp16 d + 4 B high bits + 16 B); Q5_1 32 / 24 B (fp16 d, m + 4 + 16);
  Q4_K super-block 256 / 144 B (fp16 d, dmin + 12 B of 6-bit sub-block scales/mins + 128 B nibbles);
  Q5_K 256 / 176 B (4 + 12 + 32 B high bits + 128); Q6_K 256 / 210 B (128 B low 4 bits + 64 B high 2 bits
  + 16 int8 sub-block scales + fp16 d); F16 2 B, F32 4 B per element.
Lowest compute capability (``min_cc``), by the engine that usually serves the format: vLLM needs 7.0
(its installation docs) and its AWQ kernel 7.5 ("Turing or newer", ``awq.py get_min_capability``); bf16
needs 8.0 (compat.md section 3); bitsandbytes LLM.int8 7.5 and NF4 6.0 (compat.md
section 1.2, bnb 0.50 docs); GGUF through llama.cpp's CUDA backend 6.0 (it also runs on the CPU).
Which tensors a format leaves unquantized is in ``tuneplan.deploy.weights``; GGUF's per-tensor type
choice (the K-quant mixes) in ``tuneplan.deploy.gguf``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.errors import TuneplanError
from tuneplan.estimator.weights import quant_bytes

GPTQ_GROUP = 128  # AutoGPTQ / GPTQModel default group_size, the one most published checkpoints use
AWQ_GROUP = 128  # AutoAWQ default q_group_size
INT32_BYTES = 4
FP16_BYTES = 2

# GGUF block types: elements per block, bytes per block (ggml-common.h, block_* structs).
GGUF_BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
    "Q8_0": (32, 34), "Q4_0": (32, 18), "Q5_0": (32, 22), "Q5_1": (32, 24),
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
}


@dataclass(frozen=True)
class ServeFormat:
    """One way to store the served weights."""

    key: str  # --quant-method value ("none" for 16-bit)
    precision: str  # --serve-precision it belongs to
    family: str  # "16bit", "bnb", "gptq", "awq", "gguf"
    bits: int
    label: str
    gguf_ftype: str | None = None  # llama.cpp file type for GGUF formats
    source: str = ""
    min_cc: tuple[int, int] = (7, 0)  # lowest NVIDIA compute capability its usual engine runs it on


FORMATS: dict[tuple[str, str], ServeFormat] = {
    ("bf16", "none"): ServeFormat("none", "bf16", "16bit", 16, "bf16 safetensors", min_cc=(8, 0)),
    ("fp16", "none"): ServeFormat("none", "fp16", "16bit", 16, "fp16 safetensors"),
    ("int8", "bnb"): ServeFormat("bnb", "int8", "bnb", 8, "bitsandbytes LLM.int8 (load_in_8bit)",
                                 source="bitsandbytes Int8Params: int8 CB + fp32 SCB per row", min_cc=(7, 5)),
    ("int8", "gptq"): ServeFormat("gptq", "int8", "gptq", 8, "GPTQ 8-bit, group 128",
                                  source="AutoGPTQ QuantLinear layout"),
    ("int8", "gguf-q8_0"): ServeFormat("gguf-q8_0", "int8", "gguf", 8, "GGUF Q8_0", gguf_ftype="Q8_0",
                                       source="llama.cpp LLAMA_FTYPE_MOSTLY_Q8_0", min_cc=(6, 0)),
    ("int4", "gptq"): ServeFormat("gptq", "int4", "gptq", 4, "GPTQ 4-bit, group 128",
                                  source="AutoGPTQ QuantLinear layout"),
    ("int4", "awq"): ServeFormat("awq", "int4", "awq", 4, "AWQ 4-bit GEMM, group 128",
                                 source="AutoAWQ WQLinear_GEMM layout", min_cc=(7, 5)),
    ("int4", "bnb"): ServeFormat("bnb", "int4", "bnb", 4, "bitsandbytes NF4 (load_in_4bit, double quant)",
                                 source="bitsandbytes quantize_4bit, blocksize 64", min_cc=(6, 0)),
    ("int4", "gguf-q4_k_m"): ServeFormat("gguf-q4_k_m", "int4", "gguf", 4, "GGUF Q4_K_M", gguf_ftype="Q4_K_M",
                                         source="llama.cpp LLAMA_FTYPE_MOSTLY_Q4_K_M", min_cc=(6, 0)),
    ("int4", "gguf-q4_0"): ServeFormat("gguf-q4_0", "int4", "gguf", 4, "GGUF Q4_0", gguf_ftype="Q4_0",
                                       source="llama.cpp LLAMA_FTYPE_MOSTLY_Q4_0", min_cc=(6, 0)),
}
SERVE_PRECISIONS = ("bf16", "fp16", "int8", "int4")
DEFAULT_METHOD = {"bf16": "none", "fp16": "none", "int8": "bnb", "int4": "gptq"}


def resolve_format(precision: str, method: str | None) -> ServeFormat:
    if precision not in SERVE_PRECISIONS:
        raise TuneplanError(f"unknown value {precision!r}", field="serve_precision",
                            accepted=SERVE_PRECISIONS)
    key = method or DEFAULT_METHOD[precision]
    fmt = FORMATS.get((precision, key))
    if fmt is None:
        ok = [m for (p, m) in FORMATS if p == precision]
        raise TuneplanError(f"{key!r} does not serve at {precision}", field="quant_method", accepted=ok)
    return fmt


def gptq_bytes(d_in: int, d_out: int, bits: int = 4, group: int = GPTQ_GROUP) -> int:
    """qweight + qzeros + scales + g_idx of one GPTQ linear (bias excluded)."""
    groups = -(-d_in // group)
    qweight = -(-d_in * bits // 32) * d_out * INT32_BYTES
    qzeros = groups * -(-d_out * bits // 32) * INT32_BYTES
    scales = groups * d_out * FP16_BYTES
    g_idx = d_in * INT32_BYTES
    return qweight + qzeros + scales + g_idx


def awq_bytes(d_in: int, d_out: int, group: int = AWQ_GROUP) -> int:
    """qweight + qzeros + scales of one AWQ GEMM linear, 4-bit (bias excluded)."""
    groups = -(-d_in // group)
    pack = 32 // 4  # eight 4-bit values per int32
    qweight = d_in * -(-d_out // pack) * INT32_BYTES
    qzeros = groups * -(-d_out // pack) * INT32_BYTES
    scales = groups * d_out * FP16_BYTES
    return qweight + qzeros + scales


def bnb_bytes(d_in: int, d_out: int, bits: int, double_quant: bool = True) -> int:
    storage, meta = quant_bytes(d_in * d_out, d_out, bits, double_quant)
    return storage + meta


def gguf_bytes(gtype: str, d_in: int, d_out: int) -> int:
    """Bytes of a GGUF tensor of ``d_out`` rows of ``d_in`` elements in type ``gtype``."""
    per, size = GGUF_BLOCKS[gtype]
    if d_in % per:
        raise ValueError(f"row of {d_in} is not a multiple of {gtype}'s block of {per}")
    return d_out * (d_in // per) * size


def linear_bytes(fmt: ServeFormat, d_in: int, d_out: int) -> int:
    """Stored bytes of one quantized (or 16-bit) weight matrix in a non-GGUF format."""
    if fmt.family == "16bit":
        return 2 * d_in * d_out
    if fmt.family == "gptq":
        return gptq_bytes(d_in, d_out, fmt.bits)
    if fmt.family == "awq":
        return awq_bytes(d_in, d_out)
    if fmt.family == "bnb":
        return bnb_bytes(d_in, d_out, fmt.bits)
    raise ValueError(f"GGUF tensors are sized by tuneplan.deploy.gguf, not {fmt.key}")
