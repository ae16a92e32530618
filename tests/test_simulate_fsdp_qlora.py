"""simulate/fsdp_qlora.py: fsdp_qlora's train.py wrapping (units per trainable leaf and decoder layer) and
the transformers 4.37-4.45 loss (a toy model on the fake process group; no simulation run)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tuneplan.simulate.distributed import fake_process_group
from tuneplan.simulate.fsdp1 import flat_params
from tuneplan.simulate.fsdp_qlora import _legacy_loss, legacy_causal_lm_loss, train_py_no_sync, wrap_train_py
from tuneplan.specs.setup import TrainSetup


class LlamaDecoderLayer(nn.Module):  # the class name train.py's wrapping policy looks for
    def __init__(self, adapter: bool) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.proj.requires_grad_(False)
        self.lora_A = nn.Linear(4, 2, bias=False) if adapter else None
        self.lora_B = nn.Linear(2, 4, bias=False) if adapter else None


class Toy(nn.Module):
    def __init__(self, adapter: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList([LlamaDecoderLayer(adapter), LlamaDecoderLayer(adapter)])
        if adapter:
            self.embed.requires_grad_(False)


def units(model: nn.Module, setup: TrainSetup) -> int:
    with fake_process_group(2):
        return len(flat_params(wrap_train_py(model, setup)))


def test_a_full_fine_tune_wraps_each_decoder_layer():
    # two decoder layers and the root
    assert units(Toy(adapter=False), TrainSetup(method="full", precision="bf16", gpus=2, fsdp=True)) == 3


def test_train_py_accumulates_under_no_sync_only_with_cpu_offload():
    # fsdp_qlora(): no_sync=False unless use_cpu_offload and gradient_accumulation_steps > 1
    base = dict(method="full", precision="bf16", gpus=2, fsdp=True)
    assert not train_py_no_sync(TrainSetup(grad_accum=2, **base))
    assert not train_py_no_sync(TrainSetup(grad_accum=1, offload="all", **base))
    assert train_py_no_sync(TrainSetup(grad_accum=2, offload="all", **base))


def test_lora_wraps_each_trainable_leaf_too():
    # train.py's _or_policy: a leaf whose weight requires grad (each lora_A / lora_B) is a unit of its own,
    # inside its decoder layer's unit; the frozen embedding stays in the root: 4 adapters + 2 layers + root
    assert units(Toy(adapter=True), TrainSetup(method="lora", precision="bf16", gpus=2, fsdp=True)) == 7


def test_the_legacy_loss_of_uniform_logits_is_log_vocab():
    # shifted cross-entropy on equal logits: every token has probability 1 / V, so the loss is ln V
    logits = torch.zeros(2, 5, 32)
    labels = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    assert _legacy_loss(logits, labels, 32).item() == pytest.approx(math.log(32), rel=1e-6)  # fp32


def test_the_legacy_loss_drops_the_last_position():
    # position t predicts label t + 1: a wrong last logit changes nothing
    logits = torch.zeros(1, 3, 4)
    labels = torch.tensor([[0, 1, 2]])
    base = _legacy_loss(logits, labels, 4).item()
    logits[0, -1, 0] = 50.0
    assert _legacy_loss(logits, labels, 4).item() == base


class CausalLM(nn.Module):
    loss_function = None  # transformers models carry a class-level loss_function

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = nn.Linear(4, 8).to(torch.bfloat16)


def test_legacy_causal_lm_loss_upcasts_the_logits():
    model = nn.Sequential(CausalLM())
    legacy_causal_lm_loss(model)
    lm = model[0]
    assert lm.lm_head(torch.zeros(1, 4, dtype=torch.bfloat16)).dtype == torch.float32
    assert lm.loss_function is _legacy_loss
