"""fsdp_qlora's QLoRA under its autocast precisions runs an fp32 residual stream: train.py wraps with
``MixedPrecision(param_dtype=torch.float32)``, so the bf16-stored embedding and norm weights are gathered in
fp32, the embedding's output and RMSNorm's ``weight * hidden`` are fp32, and every 4-bit linear casts its
bf16 matmul back to that fp32 input (bitsandbytes ``Linear4bit.forward``: ``out.to(inp_dtype)``).
The SwiGLU MLP therefore keeps gate-out, SiLU-out and up-out in fp32 (simulate: fsdp_qlora, Yi-1.5-34B
QLoRA on the MLP, bf16-mixed: three (3, 1024, 20480) fp32 tensors of 240 MiB per layer)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator import layer_saved  # noqa: E402
from tuneplan.estimator.memory import memory_breakdown  # noqa: E402


def _mlp_items(monkeypatch: pytest.MonkeyPatch, framework: str) -> dict[str, float]:
    seen: dict[str, float] = {}
    orig = layer_saved._with_backward

    def spy(walk, per_pos, attn, mlp_saved):  # type: ignore[no-untyped-def]
        seen.update(walk.ledger.items)
        return orig(walk, per_pos, attn, mlp_saved)

    monkeypatch.setattr(layer_saved, "_with_backward", spy)
    spec = reduced_model("01-ai/Yi-1.5-34B", 2)
    setup = build_setup(spec, method="qlora", precision="bf16-mixed", framework=framework, batch=1,
                        seq=128, gradient_checkpointing=False, bits=4, rank=16, targets="mlp", gpus=2,
                        fsdp=True, fsdp_version=1)
    memory_breakdown(spec, setup)
    return seen


def test_fsdp_qlora_autocast_keeps_fp32_mlp_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Yi-1.5-34B: MLP width 20480; the fp32 input makes each 4-bit projection's output fp32 (4 B) and
    # SiLU of an fp32 tensor stays fp32: 4 x 20480 = 81,920 B per token for each of the three
    items = _mlp_items(monkeypatch, "fsdp-qlora")
    assert items["mlp.gate_out"] == items["mlp.silu_out"] == items["mlp.up_out"] == 81_920


def test_accelerate_fsdp_qlora_gathers_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    # accelerate's FSDP1 MixedPrecision gathers in bf16: a bf16 stream, 2 x 20480 = 40,960 B per token
    items = _mlp_items(monkeypatch, "hf")
    assert items["mlp.gate_out"] == items["mlp.silu_out"] == items["mlp.up_out"] == 40_960
