"""plan/limits.py: the largest micro-batch, sequence and LoRA rank around a setup, and their caps.

The probe here is a stand-in with a known memory rule (a setup fits when batch x seq and the rank stay
under a budget), so the exact boundary is known by hand and the search must land on it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tuneplan.plan.limits import BATCH_CAP, SEQ_CAP_DEFAULT, limits_at, rank_cap, seq_cap
from tuneplan.specs.setup import TrainSetup


class RuleProbe:
    """Fits when batch x seq <= tokens and rank <= max_rank: non-decreasing memory in each field."""

    def __init__(self, tokens: float, max_rank: float, max_position: int | None = 4096, hidden: int = 1024):
        self.model = SimpleNamespace(max_position=max_position, hidden=hidden)
        self.tokens, self.max_rank = tokens, max_rank
        self.asked: list[dict] = []

    def fits(self, fields: dict) -> bool:
        self.asked.append(dict(fields))
        return fields["batch"] * fields["seq"] <= self.tokens and fields.get("rank", 0) <= self.max_rank


FIELDS = {"method": "lora", "batch": 1, "seq": 512, "rank": 16}
SETUP = TrainSetup(method="lora", batch=1, seq=512, rank=16)


def test_limits_where_memory_binds():
    probe = RuleProbe(tokens=8192, max_rank=100)
    out = limits_at(probe, FIELDS, SETUP)
    # batch at seq 512: 8,192 / 512 = 16; seq at batch 1: 8,192 (above the 4,096 positions: the cap binds)
    assert (out.max_batch, out.limited_by["batch"]) == (16, "memory")
    assert (out.max_seq, out.limited_by["seq"]) == (4096, "cap")
    assert (out.max_rank, out.limited_by["rank"]) == (100, "memory")
    assert out.caps == {"batch": BATCH_CAP, "seq": 4096, "rank": 1024}


def test_every_other_field_is_kept():
    probe = RuleProbe(tokens=3000, max_rank=10**9)
    out = limits_at(probe, FIELDS, SETUP, which=("seq",))
    assert out.max_seq == 3000 and out.max_batch is None and out.max_rank is None
    assert all(f["batch"] == 1 and f["rank"] == 16 and f["method"] == "lora" for f in probe.asked)


def test_rank_is_searched_only_for_lora():
    full = TrainSetup(method="full", batch=1, seq=512)
    out = limits_at(RuleProbe(8192, 100), {"method": "full", "batch": 1, "seq": 512}, full)
    assert out.max_rank is None and "rank" not in out.limited_by


@pytest.mark.parametrize("tokens", [512, 513, 1000, 4095, 65_536, 10**6])
def test_the_batch_found_is_the_exact_boundary(tokens):
    out = limits_at(RuleProbe(tokens, 100), FIELDS, SETUP, which=("batch",))
    assert out.max_batch == tokens // 512  # every case stays under the 4,096 cap


def test_caps():
    probe = RuleProbe(1, 1, max_position=None, hidden=2048)
    assert seq_cap(probe, TrainSetup(seq=512)) == SEQ_CAP_DEFAULT == 131072
    assert seq_cap(probe, TrainSetup(seq=200_000)) == 200_000  # a context the user extended
    assert rank_cap(probe, TrainSetup(rank=16)) == 2048
    assert rank_cap(probe, TrainSetup(rank=4096)) == 4096


def test_a_batch_that_always_fits_reaches_its_cap():
    out = limits_at(RuleProbe(float("inf"), 100), FIELDS, SETUP, which=("batch",))
    assert (out.max_batch, out.limited_by["batch"]) == (BATCH_CAP, "cap")


def test_with_the_estimator_the_limits_are_exact_boundaries():
    # the real probe: Qwen2.5-7B LoRA on a 24 GB card; each limit fits and one more does not fit, the others
    # fields held where they were (memory never falls as batch, sequence or rank grow)
    from tests.conftest import QWEN25_7B
    from tuneplan import estimate, resolve_accelerator
    from tuneplan.plan.evaluate import Prober
    from tuneplan.specs.model import model_from_config

    model = model_from_config(QWEN25_7B, "qwen7b")
    gpu = resolve_accelerator("rtx4090")
    fields = {"method": "lora", "batch": 1, "seq": 512, "rank": 16}
    probe = Prober(model, gpu, {})
    setup = probe.check_base(**fields).setup
    out = limits_at(probe, fields, setup)

    def fits(**change) -> bool:
        return estimate(model, gpu=gpu, timing=False, **{**fields, **change}).fits

    for name, value in (("batch", out.max_batch), ("seq", out.max_seq), ("rank", out.max_rank)):
        assert value is not None and fits(**{name: value}), name
        if out.limited_by[name] == "memory":
            assert not fits(**{name: value + 1}), name
        else:
            assert value == out.caps[name], name
