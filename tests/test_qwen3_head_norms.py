"""Qwen3's per-head ``q_norm`` / ``k_norm`` (transformers ``Qwen3Attention``: ``self.q_norm(self.q_proj(x)
.view(...))``; ``Qwen3RMSNorm`` upcasts its input with ``.to(torch.float32)``, which ``pow`` and the
``rsqrt`` product save, with one fp32 rsqrt per head). Sizes by hand from Qwen3-0.6B's shapes: 16 query
heads and 8 key / value heads of head_dim 128."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tuneplan.estimator.attention_saved as attention_saved
from tuneplan.api import build_setup, resolve_run
from tuneplan.estimator.instants import memory_at

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from random_setups import reduced_model  # noqa: E402

Q_WIDTH, K_WIDTH = 16 * 128, 8 * 128


def saved(layers: int) -> int:
    spec = reduced_model("Qwen/Qwen3-0.6B", layers)
    run = resolve_run(spec, build_setup(spec, method="lora", precision="bf16", batch=4, seq=512, rank=4,
                                        targets="q_proj,v_proj", dropout=0.05, gradient_checkpointing=False))
    return int(memory_at(run, 4, 512).acts.saved_bytes)


def test_the_head_norms_keep_their_fp32_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    with_norms = saved(4)
    monkeypatch.setattr(attention_saved, "HEAD_NORM_MODEL_TYPES", ())
    without = saved(4)
    tokens = 4 * 512
    # layer 0 reads the frozen embedding's output: only the adapted q_proj's output needs a gradient, so
    # only q_norm keeps its input; layers 1-3 keep both (their input needs a gradient)
    q = 4 * Q_WIDTH + 4 * 16
    k = 4 * K_WIDTH + 4 * 8
    assert with_norms - without == tokens * (q + 3 * (q + k))
