"""Pieces the framework oracles share (benchmarks/litgpt_oracle.py, benchmarks/torchtune_oracle.py): PyTorch's
SDPA flash kernel as it allocates on CUDA, for model code that calls F.scaled_dot_product_attention itself."""

from __future__ import annotations

from typing import Any

import torch

from tuneplan.simulate.kernels import _round


class FlashSDPA(torch.autograd.Function):
    """q, k, v as the kernel reads them ([B, S, H, D] views); the output is ``empty_like(q)`` (flash mha_fwd
    keeps the query's strides), saved with q, k, v, an fp32 log-sum-exp and the RNG state."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, s, h, _ = q.shape
        out = torch.empty_like(q)
        ctx.save_for_backward(q, k, v, out, torch.empty((b, h, s), dtype=torch.float32),
                              torch.empty((2,), dtype=torch.int64))
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v, *_ = ctx.saved_tensors
        b, s, h, d = q.shape
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        scratch = (torch.empty((b, h, _round(s, 128)), dtype=torch.float32),
                   torch.empty((b, _round(s, 128), h, _round(d, 32) if d <= 192 else 256),
                               dtype=torch.float32))
        del scratch
        return dq, dk, dv


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Drop-in for F.scaled_dot_product_attention with [B, H, S, D] inputs (causal, no dropout)."""
    return FlashSDPA.apply(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
