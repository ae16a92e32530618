"""The lowest trained layer at its MLP's largest weight gradient under autocast over fp32 masters: the 16-bit
``dW`` beside its fp32 ``_to_copy``, the attention block not yet back-propagated (its saved tensors, its
weights' 16-bit casts, no gradient of its own): estimator/bottom_weight_cast.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.instants import memory_at, named  # noqa: E402
from tuneplan.estimator.memory import memory_breakdown  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402

H, TOKENS = 5120, 512


def _setup(spec, **kw):
    return build_setup(spec, **{**dict(method="freeze", precision="bf16-mixed", framework="hf", batch=1,
                                        seq=512, gradient_checkpointing=False, optimizer="paged-adamw-8bit",
                                        attn="eager"), **kw})


def test_phi4_freeze_bottom_layer_at_gate_up_cast() -> None:
    # phi-4 (h 5120): attention qkv_proj 7680 x 5120 + o_proj 5120 x 5120 = 65,536,000 weights, their fp32
    # gradients (262,144,000 B) not made, their bf16 casts (131,072,000 B) saved; the largest MLP weight,
    # gate_up_proj 35840 x 5120 = 183,500,800, its bf16 dW 367,001,600 B beside the residual gradient
    # 512 x 5120 x 2 = 5,242,880 B (simulate: phi-4 freeze at 4 layers, 1 x 512, bf16-mixed: 131,072,000 B
    # of autocast copies and a (35840, 5120) bf16 mm beside the peak's fp32 _to_copy, 9,266,711,552 B)
    spec = reduced_model("microsoft/phi-4", 4)
    run = resolve_run(spec, _setup(spec))
    at = memory_at(run, 1, 512)
    row = named(at.rows["backward_bottom_weight_cast"])
    bottom = named(at.rows["backward_layers_bottom"])
    assert bottom.gradients - row.gradients == 65_536_000 * 4
    assert row.autocast_copies == 131_072_000
    assert row.backward_temp == 367_001_600 + 5_242_880
    # the attention block's saves and the MLP norm's fp32 input, rstd and gate_up's bf16 input
    assert row.activations == (at.acts.top_layer_bytes - at.acts.mlp_saved_bytes
                               + TOKENS * ((4 + 2) * H + 4))
    peak = memory_breakdown(spec, _setup(spec)).allocated_peak_bytes
    assert abs(peak / 9_266_711_552 - 1) < 0.005


def test_not_without_autocast_or_under_checkpointing() -> None:
    spec = reduced_model("microsoft/phi-4", 4)
    for kw in (dict(precision="bf16"), dict(gradient_checkpointing=True), dict(grad_accum=2)):
        rows = memory_at(resolve_run(spec, _setup(spec, **kw)), 1, 512).rows
        assert "backward_bottom_weight_cast" not in rows
