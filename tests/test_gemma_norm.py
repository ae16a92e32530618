"""Gemma's RMSNorm keeps a trained weight's normalized input in fp32 (transformers GemmaRMSNorm:
``output = self._norm(x.float()); output = output * (1.0 + self.weight.float())`` saves the fp32 ``output``
for the weight's gradient, then ``type_as(x)``), and Gemma 3's attention adds per-head ``q_norm`` /
``k_norm`` of that class (modeling_gemma3.py Gemma3Attention): estimator/gemma_norm.py,
attention_saved.head_norms."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.attention_saved import head_norms  # noqa: E402
from tuneplan.estimator.layer_walk import LayerWalk  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402


def _walk(model: str) -> LayerWalk:
    spec = reduced_model(model, 2)
    setup = build_setup(spec, method="full", precision="bf16", framework="hf", batch=2, seq=2048,
                        attn="eager")
    run = resolve_run(spec, setup)
    return LayerWalk(spec, spec.layer_groups[0][0], run.setup, run.dtypes, run.targets, True, True, False,
                     True, False, False)


def test_gemma3_norms_keep_their_output_in_fp32() -> None:
    # gemma-3-12b: h 3840, 16 heads and 8 kv heads of head_dim 256, bf16. Per token, a trained input norm
    # keeps x.float() (4 x 3840 = 15,360 B) and the fp32 normalized output (4 x 3840 = 15,360 B), not its
    # 16-bit cast (7,680 B); q_norm the fp32 input and output of 16 x 256 (16,384 B each), k_norm of 8 x 256
    # (8,192 B each). simulate (gemma-3-12b-it full zero1 ws2 at 3 layers, 2 x 2048 = 4,096 tokens, eager):
    # input_layernorm's _to_copy and mul, 62,914,560 B each; q_norm's 67,108,864 B each; k_norm's 33,554,432
    walk = _walk("google/gemma-3-12b-it")
    walk.norm("attn_norm", 3840)
    head_norms(walk)
    items = walk.ledger.items
    assert items["attn_norm.fp32_in"] == items["attn_norm.out"] == 15_360
    assert items["q_norm.fp32_in"] == items["q_norm.out"] == 16_384
    assert items["k_norm.fp32_in"] == items["k_norm.out"] == 8_192
    assert 4096 * items["q_norm.out"] == 67_108_864 and 4096 * items["k_norm.out"] == 33_554_432


def test_llama_norm_keeps_its_16_bit_cast() -> None:
    # LlamaRMSNorm (``weight * hidden.to(input_dtype)``) keeps the bf16 cast: 2 x 4096 = 8,192 B per token,
    # and Llama has no per-head norms
    walk = _walk("meta-llama/Llama-2-7b-hf")
    walk.norm("attn_norm", 4096)
    head_norms(walk)
    items = walk.ledger.items
    assert items["attn_norm.out"] == 8_192
    assert "q_norm.fp32_in" not in items
