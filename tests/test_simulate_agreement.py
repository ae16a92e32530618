"""The analytic engine against the simulate oracle on the CI subset of benchmarks/agreement.py.

The benchmark's quick cases run here on a reduced depth (3 decoder layers: the analytic engine and the
simulation read the same reduced config, so agreement is still exact per layer, for the logits chain and
for the persistent terms) to keep CI in seconds per case. Target: within 3% each.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs a simulated training step (pyproject.toml markers)

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

_BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "agreement.py"
_spec = importlib.util.spec_from_file_location("agreement_bench", _BENCH)
agreement = importlib.util.module_from_spec(_spec)
sys.modules["agreement_bench"] = agreement  # dataclasses resolve annotations through sys.modules
_spec.loader.exec_module(agreement)  # type: ignore[union-attr]

QUICK = [c for c in agreement.CASES if c.quick]
TOLERANCE = 0.03


def test_there_is_a_quick_subset() -> None:
    assert 3 <= len(QUICK) <= 8
    assert {c.setup["method"] for c in QUICK} >= {"full", "lora", "qlora"}


@pytest.mark.parametrize("case", QUICK, ids=lambda c: c.label)
def test_analytic_within_3_percent_of_simulate(case) -> None:
    r = agreement.run_case(agreement.Case(case.label, case.model, case.setup, layers=3))
    assert abs(r["rel"]) <= TOLERANCE, (
        f"{case.label}: analytic {r['ana_peak']} vs simulate {r['sim_peak']} ({100 * r['rel']:+.2f}%); "
        f"components: {r['components']}")
