"""measure/session.py: what ``measure`` refuses before it spends a run (tests/test_measure.py runs it)."""

from __future__ import annotations

import pytest

from tests.conftest import TINY_LLAMA
from tuneplan.errors import TuneplanError
from tuneplan.measure.session import measure
from tuneplan.specs.model import model_from_config


@pytest.fixture(scope="module")
def tiny():
    return model_from_config(TINY_LLAMA, "tiny")


def test_a_record_target_that_is_a_folder_is_refused_first(tiny, tmp_path):
    with pytest.raises(TuneplanError) as err:
        measure(tiny, record=tmp_path, weights=str(tmp_path / "missing"), device="cpu")
    assert err.value.field == "record"  # checked before the weights and before any run


def test_a_record_file_with_other_columns_is_refused_untouched(tiny, tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("x,y\n1,2\n")
    with pytest.raises(TuneplanError) as err:
        measure(tiny, record=other, device="cpu")
    assert err.value.field == "record" and other.read_text() == "x,y\n1,2\n"


def test_missing_weights_are_refused_before_the_run(tiny, tmp_path):
    with pytest.raises(TuneplanError) as err:
        measure(tiny, weights=str(tmp_path / "no-checkpoint"), device="cpu")
    assert err.value.field == "weights"
    assert "random weights" in err.value.accepted
