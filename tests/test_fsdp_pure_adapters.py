"""PEFT keeps LoRA adapters in fp32 on a 16-bit base (``autocast_adapter_dtype=True``, cast before FSDP
wraps the model), and FSDP shards each parameter in its own dtype. Where accelerate's mixed precision is off
(LLaMA-Factory's pure_bf16 turns the Trainer's bf16 off) there is no MixedPrecision either, so the adapters
are sharded and gathered in fp32; where the Trainer gets bf16=True (the hf profile's pure bf16), accelerate
sets MixedPrecision(bf16) and upcasts the 16-bit trainable parameters to fp32 (``prepare_model`` /
``fsdp2_prepare_model``): the run is the ``-mixed`` one of the same 16-bit base. DeepSpeed instead casts the
whole module to 16 bits. Sizes by hand from TinyLlama-1.1B's config."""

from __future__ import annotations

import pytest

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.memory import memory_breakdown

# TinyLlama-1.1B: 22 layers, hidden 2048, 32 query heads and 4 key/value heads of 64: q_proj 2048 -> 2048,
# v_proj 2048 -> 256; LoRA r=16 on q_proj, v_proj: r x (d_in + d_out) each
ADAPTER_PARAMS = 22 * (16 * (2048 + 2048) + 16 * (2048 + 256))
TINYLLAMA = "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"


def breakdown(**fields: object):
    spec = resolve_model(TINYLLAMA)
    setup = build_setup(spec, method="lora", rank=16, targets="q_proj,v_proj", batch=1, seq=256, gpus=2,
                        **fields)
    return memory_breakdown(spec, setup)


@pytest.mark.parametrize("version", [1, 2])
def test_without_mixed_precision_fsdp_shards_fp32_adapters(version: int) -> None:
    assert ADAPTER_PARAMS == 2_252_800
    got = breakdown(precision="bf16", fsdp=True, fsdp_version=version, framework="llamafactory")
    assert got.components["lora_adapters"] == ADAPTER_PARAMS * 4 // 2


@pytest.mark.parametrize("version", [1, 2])
def test_the_trainers_pure_bf16_is_its_mixed_run_under_fsdp(version: int) -> None:
    pure = breakdown(precision="bf16", fsdp=True, fsdp_version=version, framework="hf")
    mixed = breakdown(precision="bf16-mixed", fsdp=True, fsdp_version=version, framework="hf")
    assert pure.components == mixed.components


def test_fsdp_qlora_profile_keeps_adapters_in_the_model_dtype() -> None:
    # fsdp_qlora train.py builds the adapters in the model's bf16 (PEFT's autocast_adapter_dtype off there)
    got = breakdown(precision="bf16", fsdp=True, framework="fsdp-qlora")
    assert got.components["lora_adapters"] == ADAPTER_PARAMS * 2 // 2


def test_deepspeed_casts_the_adapters_to_16_bits() -> None:
    got = breakdown(precision="bf16", zero=3, framework="hf")
    assert got.components["lora_adapters"] == ADAPTER_PARAMS * 2 // 2
