"""simulate/step.py's optimizers: the bitsandbytes 8-bit / paged state layout by hand, the HF AdamW loop's
states, and which torch optimizer each name runs (no simulation run: small CPU tensors)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tuneplan.simulate.step import BnbAdamStandIn, HfAdamWLoop, make_optimizer


def state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
               if isinstance(v, torch.Tensor))


def params(*sizes: int) -> list[nn.Parameter]:
    return [nn.Parameter(torch.zeros(n)) for n in sizes]


def test_8_bit_states_by_hand():
    # bitsandbytes Optimizer8bit.init_state: uint8 state1 and state2 (2 B per element) plus an fp32
    # absmax per 256-block for each: 10,000 elements -> 20,000 + 2 x 4 x ceil(10,000 / 256) = 20,000 + 320;
    # a tensor under min_8bit_size (4,096) keeps two fp32 states: 100 elements -> 800 B
    opt = BnbAdamStandIn(params(10_000, 100), bits8=True, paged=False)
    opt.step()
    assert state_bytes(opt) == 20_320 + 800
    assert opt.paged_bytes == 0


def test_paged_states_are_not_device_allocations():
    opt = BnbAdamStandIn(params(10_000, 100), bits8=True, paged=True)
    opt.step()
    assert state_bytes(opt) == 0
    assert opt.paged_bytes == 20_320 + 800
    fp32 = BnbAdamStandIn(params(10_000), bits8=False, paged=True)  # PagedAdamW (32-bit): 8 B per element
    fp32.step()
    assert fp32.paged_bytes == 80_000


def test_states_are_made_once():
    opt = BnbAdamStandIn(params(10_000), bits8=True, paged=False)
    opt.step()
    first = state_bytes(opt)
    opt.step()
    assert state_bytes(opt) == first
    assert next(iter(opt.state.values()))["step"] == 2


def test_hf_adamw_loop_keeps_two_moments_and_steps_against_the_gradient():
    p = nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([1.0, -1.0, 0.0])
    opt = HfAdamWLoop([p])
    opt.step()
    st = opt.state[p]
    assert st["exp_avg"].shape == st["exp_avg_sq"].shape == p.shape
    assert p[0] < 1.0 < p[1] and p[2] == 1.0


def test_hf_adamw_loop_skips_parameters_without_gradients():
    p = nn.Parameter(torch.ones(3))
    opt = HfAdamWLoop([p])
    opt.step()
    assert p not in opt.state


@pytest.mark.parametrize("name, check", [
    ("adamw-fused", lambda o: isinstance(o, torch.optim.AdamW) and o.defaults["fused"]),
    ("adamw", lambda o: isinstance(o, torch.optim.AdamW) and o.defaults["foreach"]),
    ("adamw-hf", lambda o: isinstance(o, HfAdamWLoop)),
    ("sgd", lambda o: isinstance(o, torch.optim.SGD)),
    ("adamw-8bit", lambda o: isinstance(o, BnbAdamStandIn) and o.bits8 and not o.paged),
    ("paged-adamw-8bit", lambda o: isinstance(o, BnbAdamStandIn) and o.bits8 and o.paged),
    ("paged-adamw", lambda o: isinstance(o, BnbAdamStandIn) and not o.bits8 and o.paged),
])
def test_make_optimizer(name, check):
    assert check(make_optimizer(name, params(8)))


def test_make_optimizer_refuses_nothing_to_train_and_unknown_names():
    with pytest.raises(ValueError):
        make_optimizer("adamw", [])
    with pytest.raises(ValueError):
        make_optimizer("lion", params(8))


def estimated_8bit_states(n: int) -> int:
    from tuneplan.estimator.optimizer import optimizer_plan

    return optimizer_plan("adamw-8bit", n, 4, 1, n, n).states


def test_the_estimate_agrees_with_the_stand_in_for_a_large_tensor():
    opt = BnbAdamStandIn(params(65_536), bits8=True, paged=False)
    opt.step()
    assert estimated_8bit_states(65_536) == state_bytes(opt) == 2 * 65_536 + 8 * 256


@pytest.mark.xfail(strict=True, reason="estimator/optimizer.py applies 8-bit states to every tensor; its "
                   "docstring and bitsandbytes (min_8bit_size=4096) keep fp32 states under 4,096 elements")
def test_the_estimate_agrees_with_the_stand_in_for_a_small_tensor():
    opt = BnbAdamStandIn(params(1_024), bits8=True, paged=False)  # e.g. a LoRA B of 64 x 16
    opt.step()
    assert estimated_8bit_states(1_024) == state_bytes(opt) == 8 * 1_024
