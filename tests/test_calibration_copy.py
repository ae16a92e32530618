"""benchmarks/data/calibration is a verbatim copy of the calibration rows it was taken from, where that
folder is beside the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COPY = ROOT / "benchmarks" / "data" / "calibration"
SHARED = ROOT.parent / "shared" / "calibration"


def test_copy_exists() -> None:
    assert (COPY / "measured.csv").exists() and (COPY / "README.md").exists()


@pytest.mark.skipif(not SHARED.exists(),
                    reason="the calibration rows the copy was taken from are not beside this checkout")
def test_copy_equals_shared() -> None:
    for src in SHARED.iterdir():
        if src.is_file():
            assert (COPY / src.name).read_bytes() == src.read_bytes(), src.name
