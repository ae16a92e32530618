"""DeepSpeed's CPU accelerator, made to answer as the CUDA card the simulated run plans for."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def gpu_dtypes_answered() -> Iterator[None]:
    """The CPU accelerator answers which dtypes the simulated CUDA card supports.

    ``deepspeed.initialize`` refuses an fp16 config where ``get_accelerator().is_fp16_supported()`` is false
    (runtime/engine.py, "Type fp16 is not supported on your device"); DeepSpeed's CPU accelerator answers
    from the host processor (``torch.ops.mkldnn._is_mkldnn_fp16_supported``: AVX512-FP16 / AMX-FP16), which
    says nothing about the GPU the run plans for, where fp16 and bf16 are supported."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    saved = vars(acc).copy()
    acc.is_fp16_supported = lambda: True
    acc.is_bf16_supported = lambda: True
    acc.supported_dtypes = lambda: [torch.float, torch.half, torch.bfloat16]
    try:
        yield
    finally:
        for name in ("is_fp16_supported", "is_bf16_supported", "supported_dtypes"):
            if name in saved:
                setattr(acc, name, saved[name])
            else:
                delattr(acc, name)
