"""estimator/fused_layers.py: what a layer keeps under Unsloth's fused LoRA kernels, and when they apply."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import TINY_LLAMA
from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.fused_layers import unsloth_fast_lora_layer
from tuneplan.specs.model import model_from_config
from tuneplan.specs.setup import TrainSetup

BF16 = Dtypes(compute=2, autocast=False, frozen_weight=2, trainable=2, adapter=2, non_block=2, residual=2,
              norm_out=2, linear_out=2, quant_out=2)
ALL = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})


@pytest.fixture
def tiny():
    return model_from_config(TINY_LLAMA, "tiny")  # hidden 256, 8 heads x 32, 2 KV heads, intermediate 688


def test_fused_layer_by_hand(tiny):
    spec = tiny.layer_groups[0][0]
    acts = unsloth_fast_lora_layer(tiny, spec, TrainSetup(method="lora", dropout=0.0), BF16, ALL)
    assert acts is not None
    # bf16 (2 B), h = 256, q = 8 * 32 = 256, kv = 2 * 32 = 64, intermediate 688:
    #   X for LoRA_QKV and LoRA_MLP:                 2 * (256 + 256)        = 1,024
    #   q, attention output (= LoRA_W input), k, v:  2 * (2 * 256 + 2 * 64) = 1,280
    #   both RMSNorm 16-bit inputs:                  2 * (256 + 256)        = 1,024
    #   e = X @ G and g = X @ U:                     2 * 2 * 688            = 2,752
    #   fp32 log-sum-exp per head 4 * 8 = 32, two fp32 rstd 2 * 4 = 8
    assert acts.per_token == 1_024 + 1_280 + 1_024 + 2_752 + 32 + 8
    assert acts.per_token_per_pos == 0.0  # flash attention: nothing quadratic
    # backward: one intermediate-wide gradient 2 * 688 plus two residual-wide ones 2 * 2 * 256
    assert acts.backward_temp == 1_376 + 1_024
    assert acts.backward_temp_per_pos == 0.0


@pytest.mark.parametrize("setup", [
    TrainSetup(method="full"),
    TrainSetup(method="freeze"),
    TrainSetup(method="lora", dropout=0.05),  # Unsloth falls back to PEFT with LoRA dropout
])
def test_falls_back_for_other_setups(tiny, setup):
    assert unsloth_fast_lora_layer(tiny, tiny.layer_groups[0][0], setup, BF16, ALL) is None


def test_falls_back_when_a_projection_has_no_adapter(tiny):
    targets = ALL - {"down_proj"}
    assert unsloth_fast_lora_layer(tiny, tiny.layer_groups[0][0], TrainSetup(method="lora", dropout=0.0),
                                   BF16, targets) is None


@pytest.mark.parametrize("change", [{"mlp_kind": "gelu"}, {"norm_kind": "layer"}])
def test_falls_back_for_other_architectures(tiny, change):
    other = dataclasses.replace(tiny, **change)
    assert unsloth_fast_lora_layer(other, other.layer_groups[0][0], TrainSetup(method="qlora", dropout=0.0),
                                   BF16, ALL) is None


def test_fp32_compute_doubles_the_16_bit_terms(tiny):
    spec = tiny.layer_groups[0][0]
    fp32 = dataclasses.replace(BF16, compute=4, residual=4)
    setup = TrainSetup(method="lora", dropout=0.0)
    half, full = (unsloth_fast_lora_layer(tiny, spec, setup, dt, ALL) for dt in (BF16, fp32))
    assert half is not None and full is not None
    # the fp32 log-sum-exp and rstd (40 B) do not scale with the compute dtype
    assert full.per_token - 40 == 2 * (half.per_token - 40)
    assert full.backward_temp == 2 * half.backward_temp
