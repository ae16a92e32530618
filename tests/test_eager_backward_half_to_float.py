"""Eager attention's softmax backward under fp16 (ATen SoftMax.cpp ``softmax``: an fp16 CUDA input asked in
fp32 runs ``_softmax(input, dim, half_to_float=True)``, whose backward ``_softmax_backward_data(grad, output,
dim, input_dtype=Half)`` writes the scores' gradient in fp16). Expected figures counted by hand."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402


def _kinds(precision: str) -> set[tuple[float, float]]:
    spec = reduced_model("Qwen/Qwen3-32B", 3)
    run = resolve_run(spec, build_setup(spec, method="full", precision=precision, batch=1, seq=512,
                                        gradient_checkpointing=True, attn="eager", gpus=8, zero=3))
    return {(kind[1], kind[5]) for kind in memory_statics(run).acts.kinds}


def test_fp16_scores_gradient_is_half_width() -> None:
    # Qwen3-32B, 64 heads, fp16-mixed: softmax keeps its fp32 output (4 B per head and key position) and
    # probs @ V its fp16 cast (2 B). At softmax's backward the cast is gone; live beside the output are
    # ToCopyBackward's fp32 gradient of the probabilities (4 B) and the fp16 gradient of the scores (2 B):
    # 4 + 2 - 2 = 4 B per head beyond the saved 6 B
    assert _kinds("fp16-mixed") == {(6.0 * 64, 4.0 * 64)}


def test_bf16_scores_gradient_stays_fp32() -> None:
    # bf16-mixed: softmax converts the scores to fp32 first (``input_.toType(dtype)``), so the scores'
    # gradient out of softmax's backward is fp32: 4 + 4 - 2 = 6 B per head beyond the saved 6 B
    assert _kinds("bf16-mixed") == {(6.0 * 64, 6.0 * 64)}
