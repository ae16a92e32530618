"""The setup is validated once, where ``resolve_setup`` receives it: what it fills in is a profile's own
default, valid by construction, which this file checks for every profile and method."""

import pytest

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.specs import setup as setup_spec
from tuneplan.specs.profiles import PROFILES, resolve_setup
from tuneplan.specs.setup import TrainSetup


@pytest.mark.parametrize("framework", sorted(PROFILES))
@pytest.mark.parametrize("method", ["full", "freeze", "lora", "qlora"])
def test_profile_defaults_pass_validation(framework, method):
    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    for bf16 in (True, False):
        resolved = resolve_setup(TrainSetup(method=method, framework=framework), spec, supports_bf16=bf16)
        assert resolved.validate() is resolved  # nothing filled in breaks a rule


def test_invalid_input_refused_before_defaults():
    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    with pytest.raises(TuneplanError):
        resolve_setup(TrainSetup(method="bogus"), spec)  # not a KeyError in the profile's defaults
    with pytest.raises(TuneplanError):
        build_setup(spec, method="lora", rank=0)


def test_build_setup_validates_once(monkeypatch):
    calls = []
    original = setup_spec.TrainSetup.validate

    def counted(self):
        calls.append(self)
        return original(self)

    monkeypatch.setattr(setup_spec.TrainSetup, "validate", counted)
    build_setup(resolve_model("meta-llama/Llama-2-7b-hf"), method="lora", rank=16, seq=512, batch=4)
    assert len(calls) == 1
