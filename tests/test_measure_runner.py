"""measure/runner.py: which device a measurement runs on, and the inputs it refuses before any work."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import TINY_LLAMA
from tuneplan.errors import TuneplanError
from tuneplan.measure.runner import MeasureResult, pick_device, run_measure
from tuneplan.specs.model import model_from_config
from tuneplan.specs.setup import TrainSetup


def fake_torch(cuda: bool) -> SimpleNamespace:
    return SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: cuda))


@pytest.mark.parametrize("cuda, device, expected", [(True, "auto", "cuda"), (False, "auto", "cpu"),
                                                    (True, "cuda:1", "cuda:1"), (False, "cpu", "cpu"),
                                                    (True, "cpu", "cpu")])
def test_pick_device(cuda, device, expected):
    assert pick_device(fake_torch(cuda), device) == expected


def test_asking_for_cuda_without_a_gpu_is_refused():
    with pytest.raises(TuneplanError) as err:
        pick_device(fake_torch(False), "cuda")
    assert err.value.field == "device" and "cpu" in err.value.accepted


@pytest.mark.parametrize("device", ["gpu", "tpu", "mps", ""])
def test_unknown_devices_are_refused(device):
    with pytest.raises(TuneplanError) as err:
        pick_device(fake_torch(True), device)
    assert err.value.accepted == "auto, cuda, cuda:N, cpu"


@pytest.mark.parametrize("steps", [0, -1, True, 2.0, "3"])
def test_steps_must_be_a_positive_integer_before_anything_is_built(steps):
    model = model_from_config(TINY_LLAMA, "tiny")
    with pytest.raises(TuneplanError) as err:
        run_measure(model, TrainSetup(), steps=steps)
    assert err.value.field == "steps"


def test_a_result_is_plain_data():
    r = MeasureResult(model="m", setup={"batch": 1}, device="cpu", device_name="CPU", memory_kind="host",
                      memory_metric="rss", steps=1)
    d = r.to_dict()
    assert d["outcome"] == "measured" and d["peak_bytes"] is None and d["step_seconds"] == []
    d["step_seconds"].append(1.0)
    assert r.step_seconds == []  # a copy, not the result's own list
