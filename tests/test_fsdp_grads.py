"""FSDP gradients under LitGPT's wrapping (estimator/wrappers/fsdp.py), derived by hand for Llama 2 7B.

Llama 2 7B block: 4 x 4096^2 (q, k, v, o) + 3 x 4096 x 11008 (gate, up, down) + 2 x 4096 (norms)
= 202,383,360 params; 32 blocks = 6,476,267,520. LoRA r=8 on q and v: 32 x 2 x 8 x (4096 + 4096)
= 4,194,304 (the litgpt resource table prints the same trainable count).
"""

from __future__ import annotations

from tuneplan.api import estimate
from tuneplan.specs.model import model_from_config

from .conftest import LLAMA2_7B

BLOCK_PARAMS = 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096)
LORA_QV_R8 = 32 * 2 * 8 * (4096 + 4096)
LITGPT_FSDP = dict(method="lora", rank=8, targets="q_proj,v_proj", precision="bf16", optimizer="adamw",
                   batch=1, seq=512, gradient_checkpointing=True, fsdp=True, gpus=2)


def test_block_params_hand_count() -> None:
    assert BLOCK_PARAMS == 6_476_267_520
    assert model_from_config(LLAMA2_7B).params_layers == BLOCK_PARAMS


def test_litgpt_lora_accumulating_holds_unsharded_block_gradients() -> None:
    model = model_from_config(LLAMA2_7B)
    est = estimate(model, framework="litgpt", grad_accum=64, **LITGPT_FSDP)
    b = est.breakdown
    # the peak falls in an accumulating micro-batch: every block weight (bf16) has a full-size gradient
    assert b.components["gradients"] >= (BLOCK_PARAMS + LORA_QV_R8) * 2
    # weights are still sharded over the 2 GPUs
    assert b.components["weights"] + b.components["lora_adapters"] <= model.params_total + 1 + LORA_QV_R8
    assert b.allocated_peak_bytes > (BLOCK_PARAMS + LORA_QV_R8) * 2 + model.params_total


def test_litgpt_lora_without_accumulation_keeps_sharded_unit_gradients() -> None:
    model = model_from_config(LLAMA2_7B)
    accum = estimate(model, framework="litgpt", grad_accum=64, **LITGPT_FSDP).breakdown
    single = estimate(model, framework="litgpt", grad_accum=1, **LITGPT_FSDP).breakdown
    # without a no_sync micro-batch each backward reduce-scatters the unit gradients to 1/2 of their size:
    # the peak drops by at least the other half, (B + L) x 2 bytes / 2
    assert accum.allocated_peak_bytes - single.allocated_peak_bytes >= BLOCK_PARAMS + LORA_QV_R8


def test_hf_profile_keeps_adapter_only_gradients() -> None:
    # The switch is LitGPT's: the HF stack is not changed by it (adapters-only gradients, sharded).
    model = model_from_config(LLAMA2_7B)
    b = estimate(model, framework="hf", grad_accum=64, **LITGPT_FSDP).breakdown
    assert b.components["gradients"] < 1 * 2**30
