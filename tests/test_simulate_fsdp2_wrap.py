"""simulate/fsdp2.py's wrapping: ``fully_shard`` groups as accelerate's fsdp2_prepare_model applies them,
on the fake process group (a toy model, real CPU tensors: no simulation run; tests/test_simulate_fsdp2.py
runs the simulation)."""

from __future__ import annotations

import math

import torch
from torch.distributed.fsdp import FSDPModule

from tests.fsdp_toy import Block, ToyLM
from tuneplan.simulate.distributed import fake_process_group
from tuneplan.simulate.fsdp2 import device_mesh, wrap_fsdp2
from tuneplan.specs.profiles import get_profile
from tuneplan.specs.setup import TrainSetup

MIXED = TrainSetup(method="full", precision="bf16-mixed", gpus=2, fsdp=True, fsdp_version=2)


def wrap(toy: ToyLM, setup: TrainSetup = MIXED, world: int = 2):
    with fake_process_group(world):
        return wrap_fsdp2(toy, setup, get_profile(setup.framework), torch.bfloat16, device_mesh(world))


def test_groups_untied():
    toy = wrap(ToyLM())
    groups = {name for name, m in toy.named_modules() if isinstance(m, FSDPModule)}
    # each layer; the untied input embeddings; the final norm with the head (one group); the root
    assert groups == {"", "model.embed", "model.layers.0", "model.layers.1", "model.norm", "lm_head"}
    assert all(isinstance(m, FSDPModule) for m in toy.modules() if isinstance(m, Block))


def test_every_parameter_is_sharded_on_dim_0():
    # fully_shard chunks dim 0 over the mesh: rank 0 holds ceil(rows / 2) rows (torch.chunk)
    toy = wrap(ToyLM())
    for name, p in toy.named_parameters():
        assert p.to_local().shape[0] == math.ceil(p.shape[0] / 2), name
        assert p.to_local().shape[1:] == p.shape[1:], name


def test_mixed_precision_upcasts_trainable_parameters_to_fp32():
    toy = ToyLM().to(torch.bfloat16)
    toy = wrap(toy)
    assert all(p.dtype == torch.float32 for p in toy.parameters())
    # accelerate's fsdp2_prepare_model upcasts whenever its mixed_precision is not "no": the hf profile's
    # pure bf16 gives the Trainer bf16=True; LLaMA-Factory's pure_bf16 turns it off
    pure = wrap(ToyLM().to(torch.bfloat16), MIXED.replace(precision="bf16"))
    assert all(p.dtype == torch.float32 for p in pure.parameters())
    pure_lf = wrap(ToyLM().to(torch.bfloat16), MIXED.replace(precision="bf16", framework="llamafactory"))
    assert all(p.dtype == torch.bfloat16 for p in pure_lf.parameters())


def test_tied_embeddings_join_the_tail_group():
    toy = wrap(ToyLM(tied=True))
    groups = {name for name, m in toy.named_modules() if isinstance(m, FSDPModule)}
    assert "model.embed" in groups and "lm_head" in groups  # one group: norm, input and output embeddings
    assert toy.lm_head.weight is toy.model.embed.weight
