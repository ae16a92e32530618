"""simulate/fsdp1.py: FullyShardedDataParallel as accelerate builds it for the HF Trainer, on the fake
process group (a toy model, real CPU tensors: no simulation run)."""

from __future__ import annotations

import torch

from tests.fsdp_toy import ToyLM
from tuneplan.simulate.distributed import fake_process_group
from tuneplan.simulate.fsdp1 import flat_params, mixed_precision, wrap_fsdp1
from tuneplan.specs.profiles import get_profile
from tuneplan.specs.setup import TrainSetup

HF, LLAMAFACTORY = get_profile("hf"), get_profile("llamafactory")

MIXED = TrainSetup(method="full", precision="bf16-mixed", gpus=2, fsdp=True)


def test_mixed_precision_is_accelerates_policy():
    # accelerate set_mixed_precision: parameters, gradient reduction and buffers all in the 16-bit type
    mp = mixed_precision(MIXED, HF, torch.bfloat16)
    assert (mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype) == (torch.bfloat16,) * 3


def test_pure_16_bit_has_a_policy_only_where_the_trainer_gets_bf16():
    # transformers' TrainingArguments(bf16=True) sets ACCELERATE_MIXED_PRECISION=bf16 (the hf profile's pure
    # bf16 exports bf16=True); LLaMA-Factory's pure_bf16 requires bf16 / fp16 off: accelerate's "no"
    pure = MIXED.replace(precision="bf16")
    assert mixed_precision(pure, HF, torch.bfloat16).param_dtype == torch.bfloat16
    assert mixed_precision(pure.replace(framework="llamafactory"), LLAMAFACTORY, torch.bfloat16) is None


def test_accelerate_upcasts_16_bit_trainable_flat_params_under_mixed_precision():
    # accelerate Accelerator.prepare_model (FSDP1, mixed_precision != "no"): a trainable bf16 flat
    # parameter becomes fp32 after wrapping; under LLaMA-Factory's pure bf16 it stays bf16
    for framework, prof, want in (("hf", HF, torch.float32), ("llamafactory", LLAMAFACTORY, torch.bfloat16)):
        toy = ToyLM().to(torch.bfloat16)
        with fake_process_group(2):
            wrapped = wrap_fsdp1(toy, MIXED.replace(precision="bf16", framework=framework), prof,
                                 torch.bfloat16)
            assert {p.dtype for p in flat_params(wrapped)} == {want}


def test_one_unit_per_decoder_layer_and_the_root_each_a_shard():
    toy = ToyLM()
    total = sum(p.numel() for p in toy.parameters())
    with fake_process_group(2):
        wrapped = wrap_fsdp1(toy, MIXED, HF, torch.bfloat16)
        flats = flat_params(wrapped)
    # transformer_auto_wrap_policy: each Block its own unit; embeddings, norm and head stay in the root
    assert len(flats) == 3
    # each rank keeps 1/2 of every (padded) flat parameter: at least half of the model, and under all of it
    local = sum(p.numel() for p in flats)
    assert total <= 2 * local < total + 2 * 3 * 8  # padding: a few elements per unit
