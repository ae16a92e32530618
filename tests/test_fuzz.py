"""Hostile-input fuzzing in CI: 2,500 generated CLI invocations (5 seeded batches of 500), run in process.

The generator and the judge are those of ``benchmarks/fuzz.py`` (which runs 20,000 and more): hostile
names, numbers (nan, inf, -1, 0, 1e308, 400-digit integers), flag mixes across estimate, fit, gpus,
max-model, sweep, table, export, deploy, doctor --machine, models and accelerators, and hostile files
(YAML alias bombs, 100,000-level nesting, binary, NaN/inf, huge and negative fields, symbolic links,
empty files, BOMs). Each invocation must exit 0, 1 or 2, print no traceback, print strict JSON with
--json, leave the link targets and input files untouched, and finish within 10 s.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import fuzz  # noqa: E402

BATCH = 500
TIME_BOUND_S = 10.0


@pytest.mark.parametrize("seed", [11, 12, 13, 14, 15])
def test_fuzz_batch(seed, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = fuzz.fuzz(BATCH, seed, TIME_BOUND_S, root=tmp_path)
    assert res["invocations"] == BATCH
    # the generator reaches every outcome: fits, does not fit, bad input
    assert {"0", "1", "2"} <= set(res["exit_codes"]), res["exit_codes"]
    assert res["problems"] == {}, res["examples"]
    assert res["slowest_s"] < TIME_BOUND_S


def test_fuzz_new_classes(tmp_path, monkeypatch):
    """Every 5th invocation as a process (closed pipe, full disk, ASCII stream, Ctrl-C, racing exports),
    one in ten in-process ones under a hostile environment; impossible and multimodal configs are in the
    generator's files."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = fuzz.fuzz(100, 21, TIME_BOUND_S, root=tmp_path, process_every=5)
    assert sum(v for k, v in res["classes"].items() if k.startswith("[")) == 20
    assert res["problems"] == {}, res["examples"]
