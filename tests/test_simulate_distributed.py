"""simulate/distributed.py: rank 0 of an N-GPU job in one CPU process (fake process group), pinning left
out, the wrap classes read from ``_no_split_modules``, and gradient sync switched off and back on."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tuneplan.simulate.distributed import (
    fake_process_group,
    gradient_sync_off,
    host_pinning_skipped,
    layer_classes,
)


def test_fake_process_group_is_rank_0_of_n_and_is_torn_down():
    assert not dist.is_initialized()
    with fake_process_group(8):
        assert dist.is_initialized()
        assert (dist.get_rank(), dist.get_world_size()) == (0, 8)
        t = torch.ones(4)
        dist.all_reduce(t)  # answered at once by the fake group
        assert t.shape == (4,)
    assert not dist.is_initialized()


def test_a_second_group_is_refused():
    with fake_process_group(2):
        with pytest.raises(RuntimeError, match="already initialized"):
            with fake_process_group(2):
                pass
    assert not dist.is_initialized()


def test_pinning_is_skipped_only_inside():
    original = torch.Tensor.pin_memory
    t = torch.zeros(3)
    with host_pinning_skipped():
        assert t.pin_memory() is t
    assert torch.Tensor.pin_memory is original


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)


class Inner(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(2)


class CausalLM(nn.Module):  # transformers' *ForCausalLM: the inner model under .model
    def __init__(self):
        super().__init__()
        self.model = Inner()
        self.lm_head = nn.Linear(2, 3)


def test_layer_classes_follow_no_split_modules():
    assert layer_classes(CausalLM()) == {Block}
    assert layer_classes(Inner()) == {Block}
    assert layer_classes(nn.Linear(2, 2)) == set()


def test_gradient_sync_off_restores_on_error():
    calls: list[bool] = []

    class Model:
        def set_requires_gradient_sync(self, on: bool) -> None:
            calls.append(on)

    with pytest.raises(ValueError):
        with gradient_sync_off(Model()):
            assert calls == [False]
            raise ValueError("a micro-batch failed")
    assert calls == [False, True]
