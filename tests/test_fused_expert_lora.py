"""LoRA on transformers 5's fused MoE experts, by hand from PEFT 0.21's code.

peft/utils/transformers_weight_conversion.py ``_convert_peft_config_moe`` moves gate_proj / up_proj /
down_proj (Mixtral w1 / w3 / w2) off ``target_modules`` onto the fused parameters gate_up_proj (rank 2r) and
down_proj (rank r) of the types transformers' ``_MODEL_TO_CONVERSION_PATTERN`` maps (deepseek_v2, qwen3_moe,
mixtral via PEFT's own row; not qwen2_moe); a ``lora.ParamWrapper`` on E experts has lora_A [r E, d_in] and
lora_B [d_out, r E]; ``_LoraFactorsProxy`` builds ``baddbmm(W, B, A)``, a new stack in W's dtype, which
grouped_mm keeps when its input needs a gradient.

DeepSeek-V2-Lite: h 2048, moe_intermediate f 1408, 64 routed experts, first layer dense (the reduced
4-layer model is one dense layer and four MoE layers). Simulate (hf, bf16-mixed, r 16, mlp): 206.0 MiB of
fp32 adapters = 4 layers x 13,500,416 parameters; live at the loss backward: 3 gate_up effective weights
[64, 2816, 2048] and 4 down [64, 2048, 1408] (the first MoE layer's input needs no gradient: the dense layer
below keeps no adapter).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tuneplan.api import build_setup
from tuneplan.compat import check
from tuneplan.estimator.activations import layer_kinds
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.estimator.weights import lora_targets, trainable_params
from tuneplan.specs.lora_targets import STACK_MARK
from tuneplan.specs.profiles import get_profile, resolve_setup

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from random_setups import reduced_model  # noqa: E402

DS = "deepseek-ai/DeepSeek-V2-Lite"
H, F, E, R = 2048, 1408, 64, 16


def _setup(model: str, layers: int, **kw: object) -> tuple[object, object]:
    spec = reduced_model(model, layers)
    s = resolve_setup(build_setup(spec, **dict(dict(method="lora", rank=R, framework="hf",
                                                     precision="bf16-mixed", gradient_checkpointing=False),
                                                **kw)), spec)
    return spec, s


def test_mlp_targets_move_onto_the_fused_stacks() -> None:
    spec, s = _setup(DS, 4, targets="mlp")
    # gate_proj / up_proj / down_proj leave, dense layer and shared experts included
    assert lora_targets(spec, s) == {STACK_MARK + "gate_up_proj", STACK_MARK + "down_proj"}
    spec, s = _setup(DS, 4, targets="all-linear")
    got = lora_targets(spec, s)
    assert {"q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", STACK_MARK + "gate_up_proj"} <= got
    assert not any(n.endswith("gate_proj") for n in got)


def test_qwen2_moe_is_not_converted() -> None:
    spec, s = _setup("Qwen/Qwen2-57B-A14B", 2, targets="mlp")
    assert not any(n.startswith(STACK_MARK) for n in lora_targets(spec, s))


def test_adapter_count_by_hand() -> None:
    spec, s = _setup(DS, 4, targets="mlp")
    gate_up = 2 * R * E * (H + 2 * F)  # 9,961,472
    down = R * E * (F + H)  # 3,538,944
    assert trainable_params(spec, s) == 4 * (gate_up + down) == 54_001_664


def test_effective_weights_kept_per_moe_layer() -> None:
    spec, s = _setup(DS, 4, targets="mlp")
    dt = resolve_dtypes(s, get_profile("hf"))
    kinds = layer_kinds(spec, s, dt, lora_targets(spec, s), "sdpa", True).kinds
    gate_up, down = E * 2 * F * H * 2, E * H * F * 2  # bf16 stacks: 704 MiB, 352 MiB
    dense, first_moe, moe = kinds
    assert dense[1] == 1 and dense[0].per_token == 0  # no adapter below: nothing recorded
    assert first_moe[1] == 1 and first_moe[0].per_layer == down  # its input needs no gradient
    assert moe[1] == 3 and moe[0].per_layer == gate_up + down
    # down_proj's weight gradient first (352 MiB), then gate_up's (704 MiB) once down's weight is freed
    assert moe[0].backward_per_layer == max(down, gate_up - down) == down
    # beside down_proj's weight gradient: its output's and input's gradients (k = 6 routed copies, bf16)
    # and the residual's two
    assert moe[0].backward_per_layer_per_token == 2 * 6 * (F + H) + dt.residual * 2 * H


def test_partial_fused_target_is_an_error() -> None:
    for model, targets, bad in ((DS, "gate_proj,down_proj", True), ("Qwen/Qwen3-30B-A3B", "up_proj", True),
                                ("mistralai/Mixtral-8x7B-v0.1", "w1,w2", True),
                                ("mistralai/Mixtral-8x7B-v0.1", "w1,w3", False),
                                ("Qwen/Qwen2-57B-A14B", "gate_proj", False)):
        spec = reduced_model(model, 2)
        s = build_setup(spec, method="lora", targets=targets)
        codes = {f.code: f.level for f in check(None, s, spec)}
        assert (codes.get("moe-fused-target-partial") == "error") is bad, (model, targets)


def test_stack_weight_gradient_flops_by_hand() -> None:
    from tuneplan.estimator.compute import flops_per_token

    spec, s = _setup(DS, 4, targets="mlp")
    top_k = 6
    # grouped_mm's weight gradient of both stacks, per token: 2 k (h x 2f + f x h) per MoE layer
    per_layer = 2 * top_k * (H * 2 * F + F * H)
    assert flops_per_token(spec, s).parts["linear_bwd_weight"] == 4 * per_layer == 415_236_096
