"""plan/sizes.py: the global batch rule over one family's micro-batch grid, the grid's width, what passes
on a card, and the shared grid agreeing with the scalar estimate."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import TINY_LLAMA
from tuneplan import resolve_accelerator
from tuneplan.api import estimate
from tuneplan.plan.margin import Margin
from tuneplan.plan.sizes import BLOCK, Row, Shared, SizeGrid, choose, grid_width
from tuneplan.specs.model import model_from_config

GIB = 1024**3


def verdicts(width: int, pass0: int, pass1: int):
    """ok(0): micro-batch 1..pass0 pass without accumulation; ok(1): 1..pass1 with it."""
    rows = {0: np.arange(1, width + 1) <= pass0, 1: np.arange(1, width + 1) <= pass1}
    asked: list[int] = []

    def ok(i: int) -> np.ndarray:
        asked.append(i)
        return rows[i]
    return ok, asked


def test_rule_1_the_whole_per_gpu_batch_without_accumulation():
    ok, asked = verdicts(16, 16, 16)
    assert choose(ok, 8, 1) == (8, 1)
    assert asked == [0]  # accumulation is not looked at when step 1 succeeds


def test_rule_2_the_largest_micro_batch_that_divides_the_per_gpu_batch():
    ok, _ = verdicts(16, 3, 2)
    assert choose(ok, 8, 1) == (2, 4)  # 8 = 2 x 4
    ok, _ = verdicts(16, 5, 5)
    assert choose(ok, 12, 1) == (4, 3)  # 5 passes but does not divide 12; 4 does: 12 = 4 x 3


def test_rule_2_when_the_gpus_do_not_divide_the_global_batch():
    # 10 sequences over 4 GPUs: top = ceil(10 / 4) = 3; b = 2 passes; accumulation ceil(10 / (2 x 4)) = 2
    ok, _ = verdicts(16, 2, 2)
    assert choose(ok, 10, 4) == (2, 2)


def test_rule_3_relaxes_the_global_batch():
    # nothing passes with accumulation (its gradients live through the next forward); 3 does without
    ok, _ = verdicts(16, 3, 0)
    assert choose(ok, 8, 1) == (3, 1)


def test_nothing_passes():
    ok, _ = verdicts(16, 0, 0)
    assert choose(ok, 8, 1) is None
    ok, asked = verdicts(16, 0, 0)
    assert choose(ok, 1, 4) is None and asked == [0]  # top = 1: accumulation cannot help


def test_a_target_past_the_grid_width_accumulates():
    ok, _ = verdicts(4, 4, 4)
    assert choose(ok, 100, 1) == (4, 25)  # 100 = 4 x 25


@pytest.mark.parametrize("top, limit, width", [
    (100, None, 100),  # within one block: every micro-batch up to top
    (1000, 10**9, 1000),  # the widest always fits: doubles 256 -> 512 -> 1000 (never past top)
    (1000, 300, 512),  # 256 fits, 512 does not: stop at 512
    (1000, 100, BLOCK),  # the block's widest does not fit: one block
])
def test_grid_width(top, limit, width):
    assert grid_width(top, lambda w: limit is not None and w <= limit) == width


def test_size_grid_passes_reads_memory_host_and_margin():
    # the verdict reads what the card must hold (the device peak less the segments the allocator frees
    # before it fails: 0.25 GiB at the last cell); the peak itself is only what nvidia-smi would show
    row = Row(device_peak=np.array([1, 2, 3, 4]) * GIB,
              device_needed=np.array([1, 2, 3, 3.75]) * GIB,
              device_peak_high=np.array([2, 3, 4, 5]) * GIB, host=np.array([0, 5, 0, 0]) * GIB)
    planes: list[int] = []

    def plane(i: int) -> Row:
        planes.append(i)
        return row
    grid = SizeGrid(4, plane)
    assert grid.cells == 0
    # 3.5 GiB card: peaks 1, 2, 3 pass; the node's 2 GPUs offload 2 x 5 GiB at micro-batch 2 > 8 GiB host
    assert list(grid.passes(0, int(3.5 * GIB), 8 * GIB, 2, None)) == [True, False, True, False]
    # a 3.8 GiB card holds the last cell's needed 3.75 GiB though its device peak is 4 GiB
    assert list(grid.passes(0, int(3.8 * GIB), 8 * GIB, 2, None)) == [True, False, True, True]
    # the band margin needs the upper band to fit: 2, 3 GiB pass; 4 does not
    assert list(grid.passes(0, int(3.5 * GIB), 100 * GIB, 1, Margin("band"))) == [True, True, False, False]
    # a 1 GiB margin: central peak + 1 GiB <= 3.5 GiB
    one_gib = Margin("bytes", GIB)
    assert list(grid.passes(0, int(3.5 * GIB), 100 * GIB, 1, one_gib)) == [True, True, False, False]
    assert planes == [0] and grid.cells == 4  # row 0 built once, row 1 never


def test_shared_grid_agrees_with_the_scalar_estimate():
    model = model_from_config(TINY_LLAMA, "tiny")
    gpu = resolve_accelerator("rtx4090")
    shared = Shared(model)
    fields = {"method": "lora", "seq": 256}
    grid = shared.grid(gpu, fields, 8)
    assert grid is not None
    for ga in (1, 2):
        peaks = grid.row(ga - 1).device_peak
        for b in (1, 4, 8):
            est = estimate(model, gpu=gpu, batch=b, grad_accum=ga, **fields)
            assert int(peaks[b - 1]) == est.breakdown.device_peak_bytes, (b, ga)


def test_shared_memory_is_kept_and_errors_are_words():
    model = model_from_config(TINY_LLAMA, "tiny")
    gpu = resolve_accelerator("rtx4090")
    shared = Shared(model)
    fields = {"method": "lora", "seq": 256, "batch": 2, "grad_accum": 1}
    first = shared.memory(gpu, fields)
    assert first is not None and shared.memory(gpu, fields) is first
    assert shared.errors(gpu, fields) == []
    assert shared.memory(gpu, {**fields, "rank": -1}) is None
    assert shared.errors(gpu, {**fields, "rank": -1})  # the setup's own refusal, as text
