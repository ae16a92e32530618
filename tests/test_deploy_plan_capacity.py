"""deploy/plan.py's capacity helpers: sequences at a context, the longest one sequence, and the kernels'
compute capability (tests/test_deploy_plan.py holds plan_deploy's own tests)."""

from __future__ import annotations

import dataclasses

import pytest

from tuneplan.deploy.formats import resolve_format
from tuneplan.deploy.kv_cache import KvLayout
from tuneplan.deploy.plan import max_concurrency, max_context, runs_on
from tuneplan.specs.hardware import Accelerator

# 32 full-attention layers x 8 KV heads x (128 + 128) x 2 B = 131,072 bytes per token (Llama-3-8B shape)
FULL = KvLayout(per_token_full=131_072, per_token_window=0, window=None, full_layers=32, window_layers=0,
                kind="gqa")
# half the layers slide over a 1,024-token window
MIXED = KvLayout(per_token_full=65_536, per_token_window=65_536, window=1024, full_layers=16,
                 window_layers=16, kind="gqa")
GIB = 1024**3


def test_max_concurrency_by_hand():
    # 8 GiB free, 4,096 tokens x 131,072 B = 512 MiB per sequence: 16 sequences
    assert max_concurrency(8 * GIB, FULL, 4096) == 16
    assert max_concurrency(8 * GIB - 1, FULL, 4096) == 15
    assert max_concurrency(-5, FULL, 4096) == 0


def test_max_concurrency_of_an_empty_cache_is_zero():
    empty = dataclasses.replace(FULL, per_token_full=0)
    assert max_concurrency(GIB, empty, 4096) == 0


def test_max_context_by_hand():
    # 1 GiB / 131,072 B per token = 8,192 tokens exactly
    assert max_context(GIB, FULL, 1 << 24) == 8192
    assert max_context(GIB - 1, FULL, 1 << 24) == 8191
    assert max_context(GIB, FULL, 1000) == 1000  # capped by the limit
    assert max_context(0, FULL, 1000) == 0


@pytest.mark.parametrize("free", [1, 10**6, 3 * GIB + 12345, 40 * GIB])
def test_max_context_is_the_largest_that_fits(free):
    n = max_context(free, MIXED, 1 << 24)
    assert MIXED.bytes_for(n) <= free < MIXED.bytes_for(n + 1)


def test_sliding_layers_stretch_the_context():
    # past the window only the full layers grow: 1 GiB holds 1,024 x 131,072 B = 128 MiB for the first
    # 1,024 tokens, then 65,536 B a token: 1,024 + 896 MiB / 64 KiB = 1,024 + 14,336 = 15,360 tokens
    assert max_context(GIB, MIXED, 1 << 24) == 15_360


def card(cc):
    return Accelerator(id="c", name="C", vendor="nvidia", memory_gb_marketed=16.0, compute_capability=cc)


def test_runs_on_compute_capability():
    bf16 = resolve_format("bf16", None)  # bf16 needs Ampere (8.0)
    assert runs_on(card((8, 0)), bf16) == (True, "")
    ok, why = runs_on(card((7, 5)), bf16)
    assert not ok and "8.0" in why and "7.5" in why
    awq = resolve_format("int4", "awq")  # AWQ GEMM kernels: 7.5 and up
    assert runs_on(card((7, 5)), awq)[0] and not runs_on(card((7, 0)), awq)[0]


def test_runs_on_a_card_without_a_compute_capability_is_not_checked():
    ok, why = runs_on(card(None), resolve_format("bf16", None))
    assert ok and "not checked" in why
