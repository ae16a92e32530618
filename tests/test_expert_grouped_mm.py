"""A frozen fused expert stack under ZeRO-3 keeps no input: transformers 5's experts run torch._grouped_mm,
which DeepSpeed's F.linear replacement (LinearFunctionForZeroStage3) does not reach; counted by hand
(estimator/expert_grouped_mm.py)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.layer_saved import layer_activations
from tuneplan.estimator.run import resolve_run
from tuneplan.specs.model import model_from_config

H, F, K, E = 4096, 14336, 2, 8  # Mixtral-8x7B: hidden, expert width, top-k, experts


def mlp_saved(**kw: object) -> float:
    base = resolve_model("mistralai/Mixtral-8x7B-v0.1", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=2), "mixtral-2L")
    setup = build_setup(spec, method="lora", precision="fp32", framework="llamafactory", gpus=2,
                        gradient_checkpointing=False, attn="sdpa", **kw)
    run = resolve_run(spec, setup)
    assert not any("expert" in t or "gate_up" in t for t in run.targets)  # the attention's linears only
    layer = spec.layer_groups[-1][0]
    return layer_activations(spec, layer, setup, run.dtypes, run.targets, False, "sdpa", True).mlp_saved


def test_a_frozen_fused_expert_stack_keeps_no_input_under_zero3() -> None:
    # fp32, per token, the MoE block of a frozen layer LoRA trains the attention of: the norm's fp32 input
    # (4h) and rstd (4); the router, an nn.Linear (F.linear: ZeRO-3's LinearFunctionForZeroStage3), keeps
    # its normalized input (4h); its fp32 softmax over E experts (4E); per routed copy (k of them) the
    # gate_up stack's output (4 x 2f: SiLU's input and the up half the product reads), SiLU's output (4f)
    # and the down stack's output the routing weights multiply (4h). Not the gathered tokens (4h k) nor
    # the gated product (4f k): grouped_mm keeps them only for a stack weight's gradient.
    expected = 4 * H + 4 + 4 * H + 4 * E + K * (4 * 2 * F + 4 * F + 4 * H)
    assert expected == 409_636
    assert mlp_saved(zero=3, offload="optimizer") == expected
    # ZeRO-2: plain autograd everywhere, the frozen router keeps no input either; the rest is the same
    assert mlp_saved(zero=2) == expected - 4 * H
