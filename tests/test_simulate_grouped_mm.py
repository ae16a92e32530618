"""The simulation's grouped matmul on fp32 / fp16 fused experts: CUDA's ``_grouped_mm_fallback``
(aten/src/ATen/native/cuda/GroupedBlas.cpp) returns the output in the input dtype, S x N for an S x K input
and E x K x N experts, where torch's meta function accepts bf16 only."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_fp32_grouped_mm_gets_the_fallbacks_output_under_fake_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tuneplan.simulate.grouped_mm import grouped_mm_any_dtype

    with FakeTensorMode():
        a = torch.empty(96, 64, dtype=torch.float32)
        b = torch.empty(4, 64, 32, dtype=torch.float32)
        offs = torch.tensor([24, 48, 72, 96], dtype=torch.int32)
        with pytest.raises(RuntimeError, match="BF16"):
            torch._grouped_mm(a, b, offs=offs)
        with grouped_mm_any_dtype():
            out = torch._grouped_mm(a, b, offs=offs)
            assert out.shape == (96, 32) and out.dtype == torch.float32
            half = torch._grouped_mm(a.half(), b.half(), offs=offs)
            assert half.dtype == torch.float16
