"""FSDP under a pure 16-bit precision keeps PEFT's fp32 adapters in fp32: accelerate sets no FSDP
MixedPrecision for it, PEFT's ``autocast_adapter_dtype=True`` casts the adapters to fp32 before FSDP wraps
the model, and FSDP shards each parameter in its own dtype. DeepSpeed instead casts the whole module to the
16-bit dtype (its fp32 master lives in the optimizer). Sizes by hand from TinyLlama-1.1B's config."""

from __future__ import annotations

import pytest

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.memory import memory_breakdown

# TinyLlama-1.1B: 22 layers, hidden 2048, 32 query heads and 4 key/value heads of 64: q_proj 2048 -> 2048,
# v_proj 2048 -> 256; LoRA r=16 on q_proj, v_proj: r x (d_in + d_out) each
ADAPTER_PARAMS = 22 * (16 * (2048 + 2048) + 16 * (2048 + 256))


def resident_adapters(**fields: object) -> int:
    spec = resolve_model("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T")
    setup = build_setup(spec, method="lora", rank=16, targets="q_proj,v_proj", batch=1, seq=256, gpus=2,
                        **fields)
    return memory_breakdown(spec, setup).components["lora_adapters"]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_pure_precision_fsdp_shards_fp32_adapters(version: int, precision: str) -> None:
    assert ADAPTER_PARAMS == 2_252_800
    got = resident_adapters(precision=precision, fsdp=True, fsdp_version=version, framework="hf")
    assert got == ADAPTER_PARAMS * 4 // 2


def test_fsdp_qlora_profile_keeps_adapters_in_the_model_dtype() -> None:
    # fsdp_qlora train.py builds the adapters in the model's bf16 (PEFT's autocast_adapter_dtype off there)
    got = resident_adapters(precision="bf16", fsdp=True, framework="fsdp-qlora")
    assert got == ADAPTER_PARAMS * 2 // 2


def test_deepspeed_casts_the_adapters_to_16_bits() -> None:
    got = resident_adapters(precision="bf16", zero=3, framework="hf")
    assert got == ADAPTER_PARAMS * 2 // 2
