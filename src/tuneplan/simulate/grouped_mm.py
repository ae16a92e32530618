"""torch's grouped matmul on non-bf16 inputs, as CUDA runs it.

transformers 5 runs fused MoE experts through ``torch.nn.functional.grouped_mm`` (integrations/moe.py
``_grouped_mm``, which casts the input to the experts' dtype). On CUDA, ``aten::_grouped_mm``
(aten/src/ATen/native/cuda/GroupedBlas.cpp ``_grouped_mm_cuda``) takes the CUTLASS fast path for bf16 and
otherwise ``_grouped_mm_fallback``: the output in the input dtype, filled group by group with ``mm_out`` /
``bmm_out``, nothing else allocated on the GPU. Its meta function (torch/_meta_registrations.py
``_meta_grouped_mm_common``) checks for bf16 only and so refuses fp32 / fp16 experts, which the real stack
runs: QLoRA leaves the fused experts unquantized and PEFT's ``prepare_model_for_kbit_training`` upcasts
them to fp32; an fp16 run loads them in fp16. Under :func:`grouped_mm_any_dtype` an unscaled grouped
matmul of same-dtype fp32 / fp16 operands gets the fallback's output (same shape rule, same dtype).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def grouped_mm_any_dtype() -> Iterator[None]:
    """Let the fake ``aten::_grouped_mm`` accept fp32 / fp16 operands as CUDA's fallback does (module doc)."""
    import torch._meta_registrations as meta

    orig = meta._meta_grouped_mm_common

    def common(mat_a: torch.Tensor, mat_b: torch.Tensor, scale_a: Any = None, scale_b: Any = None,
               offs: Any = None, bias: Any = None, scale_result: Any = None, out_dtype: Any = None,
               **kwargs: Any) -> Any:
        if (scale_a is None and scale_b is None and mat_a.dtype == mat_b.dtype
                and mat_a.dtype in (torch.float32, torch.float16)):
            return meta._create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)
        return orig(mat_a, mat_b, scale_a, scale_b, offs=offs, bias=bias, scale_result=scale_result,
                    out_dtype=out_dtype, **kwargs)

    meta._meta_grouped_mm_common = common  # type: ignore[assignment]
    try:
        yield
    finally:
        meta._meta_grouped_mm_common = orig
