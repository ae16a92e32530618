"""A MoE layer's LoRA factors on its fused expert stacks popped with the layer below's ``gate_up_proj`` in
one coalesced ZeRO-3 round, counted by hand from DeepSpeed 0.19.8
(estimator/wrappers/zero3_factor_round.py)."""

from __future__ import annotations

from typing import Any

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_factor_round import zero3_factor_round_bytes
from tuneplan.specs.model import model_from_config


def test_a_middle_layers_factor_round_holds_the_lower_stack_twice() -> None:
    # Qwen3-30B-A3B, QLoRA nf4 rank 32 on the MLP with checkpointing in fp32 over 4 GPUs: 128 experts,
    # h 2048, f 768. gate_up_proj 128 x 1536 x 2048 = 402,653,184, down_proj 128 x 2048 x 768 =
    # 201,326,592; PEFT's factors: gate_up at rank 2 x 32 = 64, 64 x 128 x (2048 + 1536) = 29,360,128,
    # down 32 x 128 x (768 + 2048) = 11,534,336; the router 128 x 2048 = 262,144 (past 1e5): F = 41,156,608.
    # Packed attention codes: q 2048 x 4096 / 2 = 4,194,304, k / v 2048 x 512 / 2 = 524,288, o 4,194,304:
    # 9,437,184 a layer. Kept embedding 151936 x 2048 = 311,164,928. A = 311,164,928 + 402,653,184 +
    # 201,326,592 + 2 x 9,437,184 = 934,019,072: the limit is min(6.598e7, 5e7) = 5e7 > F, so the round
    # takes layer 0's gate_up_proj: its flat buffer (F + 402,653,184) and the stack's copy, 4 bytes each
    base = resolve_model("Qwen/Qwen3-30B-A3B", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=3), "qwen3-30b-a3b-3L")
    run = resolve_run(spec, build_setup(spec, **_kw()))
    assert spec.embed_params == 311_164_928
    assert zero3_factor_round_bytes(run, 50_000_000) == (41_156_608 + 2 * 402_653_184) * 4
    # a factor round past the bucket (here 4e7 < F) ends before the lower stack; two layers: none below
    assert zero3_factor_round_bytes(run, 40_000_000) == 0
    two = model_from_config(dict(base.config, num_hidden_layers=2), "qwen3-30b-a3b-2L")
    assert zero3_factor_round_bytes(resolve_run(two, build_setup(two, **_kw())), 50_000_000) == 0


def _kw() -> dict[str, Any]:
    return dict(method="qlora", precision="fp32", gpus=4, zero=3, rank=32, targets="mlp",
                gradient_checkpointing=True)


def test_a_middle_layers_router_alone_takes_the_lower_stack_along() -> None:
    # the same model over 4 layers, QLoRA nf4 rank 8 on q/v (no factor on the stacks) in bf16-mixed over 8
    # GPUs: the stacks in bf16, F the router alone, 262,144 < min(1e9 - 934,019,072, 5e7) (A as above):
    # the round [router, layer below's gate_up_proj] in one 402,915,328-element bf16 buffer beside the
    # stack's copy
    base = resolve_model("Qwen/Qwen3-30B-A3B", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=4), "qwen3-30b-a3b-4L")
    setup = build_setup(spec, method="qlora", precision="bf16-mixed", gpus=8, zero=3, rank=8,
                        targets="q_proj,v_proj", gradient_checkpointing=True)
    assert zero3_factor_round_bytes(resolve_run(spec, setup), 50_000_000) == (262_144 + 2 * 402_653_184) * 2
