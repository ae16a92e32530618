"""The random-setup generator of ``benchmarks/agreement.py --random`` (``benchmarks/random_setups.py``): a
fixed sample from the catalog models of at most 2B parameters spans the setup space (every method and
strategy, several world sizes and framework profiles), and the same seed draws the same sample.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import random_agreement  # noqa: E402
import random_setups  # noqa: E402

SAMPLE = 36
SAMPLE_SEED = 2025
MAX_PARAMS = 2_000_000_000


def test_the_sample_spans_the_space() -> None:
    """The fixed sample draws every method and every strategy, several world sizes and profiles."""
    draws = random_setups.sample(SAMPLE, SAMPLE_SEED, max_params=MAX_PARAMS)
    axes = [random_agreement.axes(d) for d in draws]
    assert {a["method"] for a in axes} == {"full", "freeze", "lora", "qlora"}
    assert {a["strategy"] for a in axes} >= {"one GPU", "ddp", "fsdp1", "fsdp2", "zero1", "zero2", "zero3"}
    assert len({a["world size"] for a in axes}) >= 3
    assert len({a["framework"] for a in axes}) >= 3
    assert len(draws) == len({d.label for d in draws}) == SAMPLE


def test_the_same_seed_draws_the_same_sample() -> None:
    a = random_setups.sample(8, SAMPLE_SEED, max_params=MAX_PARAMS)
    b = random_setups.sample(8, SAMPLE_SEED, max_params=MAX_PARAMS)
    assert a == b and a != random_setups.sample(8, SAMPLE_SEED + 1, max_params=MAX_PARAMS)
