"""The analytic engine against the simulation on a fixed sample of random valid setups (the property of
``benchmarks/agreement.py --random``): within 3 % of the simulated allocated peak on at least 95 % of the
setups the simulation runs, and none beyond 10 %.

The sample is drawn by ``benchmarks/random_setups.py`` over the whole setup space (method, strategy and
world size, offload, framework profile, precision, optimizer, attention, checkpointing, quantization,
targets, batch x length, accumulation, classifier heads) from the catalog models of at most 2B parameters,
each at 2-4 layers: a few minutes in one process. Setups the simulation cannot run are skipped by it with
its reason; the test asserts that enough of the sample was compared for the share to mean something.
Marked ``slow`` (``-m "not slow"`` leaves it out locally); CI runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import random_agreement  # noqa: E402
import random_setups  # noqa: E402

SAMPLE = 36
SAMPLE_SEED = 2025
MAX_PARAMS = 2_000_000_000
MIN_COMPARED = 20


@pytest.mark.slow
def test_analytic_agrees_with_the_simulation_on_random_setups() -> None:
    draws = random_setups.sample(SAMPLE, SAMPLE_SEED, max_params=MAX_PARAMS)
    records = random_agreement.run(draws, jobs=1)
    s = random_agreement.summarize(records)
    report = "\n".join(random_agreement.report_lines(s))
    assert not s["errors"], report
    assert s["compared"] >= MIN_COMPARED, report
    assert s["share_within_3pct"] >= 0.95, report
    assert s["beyond_10pct"] == 0, report


def test_the_sample_spans_the_space() -> None:
    """The fixed sample draws every method and every strategy, several world sizes and profiles."""
    draws = random_setups.sample(SAMPLE, SAMPLE_SEED, max_params=MAX_PARAMS)
    axes = [random_agreement.axes(d) for d in draws]
    assert {a["method"] for a in axes} == {"full", "freeze", "lora", "qlora"}
    assert {a["strategy"] for a in axes} >= {"one GPU", "ddp", "fsdp1", "fsdp2", "zero1", "zero2", "zero3"}
    assert len({a["world size"] for a in axes}) >= 3
    assert len({a["framework"] for a in axes}) >= 3
    assert len(draws) == len({d.label for d in draws}) == SAMPLE
