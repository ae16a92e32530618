"""build_export writes the plan the face estimated: it quotes that Estimate and estimates nothing again,
except a recipe that runs another framework's code than the plan's profile (estimated once with it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tuneplan.api as api
from tuneplan.api import estimate
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.export import build_export
from tuneplan.specs.setup import TrainSetup

GIB = 1024**3  # the recipe header's unit


@pytest.fixture
def estimates(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every estimate made from here on (``api.estimate`` ends in ``estimate_run``): the setup's profile."""
    made: list[str] = []
    original = api.estimate_run

    def counted(run: api.Run, **kw: Any) -> api.Estimate:
        made.append(run.setup.framework)
        return original(run, **kw)

    monkeypatch.setattr(api, "estimate_run", counted)
    return made


def test_a_recipe_quotes_the_estimate_it_is_given_and_makes_none(estimates: list[str]) -> None:
    spec, card = resolve_model("Qwen/Qwen2.5-7B"), resolve_accelerator("a100-80gb-sxm4")
    plan = estimate(spec, TrainSetup(method="lora", gpus=2, zero=2), gpu=card, timing=False)
    assert estimates == ["hf"]
    for fmt in ("hf-script", "accelerate", "deepspeed"):  # hf-script and accelerate add the DeepSpeed JSON
        bundle = build_export(fmt, plan, Path("out") / "recipe")
        assert bundle.setup == plan.setup
    assert estimates == ["hf"]  # before, each export estimated 2 to 4 times (refusal, fit note, each header)
    script = build_export("hf-script", plan, "train.py").files[0][1]
    b = plan.breakdown
    assert (f"Estimated per-GPU peak: {b.device_peak_bytes / GIB:.2f} GiB device "
            f"({b.allocated_peak_bytes / GIB:.2f} GiB allocated) on {card.name}") in script


def test_a_recipe_of_another_frameworks_code_is_estimated_once_with_its_profile(estimates: list[str]) -> None:
    spec = resolve_model("Qwen/Qwen2.5-7B")
    plan = estimate(spec, TrainSetup(method="lora", gpus=2, fsdp=True), timing=False)
    bundle = build_export("llamafactory", plan, "train.yaml")  # the YAML and its accelerate config
    assert len(bundle.files) == 2
    assert estimates == ["hf", "llamafactory"]
    assert bundle.setup.framework == "llamafactory" and "llamafactory profile" in bundle.notes[0]


def test_a_plan_that_does_not_fit_is_written_with_a_note(estimates: list[str]) -> None:
    spec, card = resolve_model("Qwen/Qwen2.5-7B"), resolve_accelerator("rtx4090")
    plan = estimate(spec, TrainSetup(method="full"), gpu=card, timing=False)
    assert plan.fits is False
    bundle = build_export("hf-script", plan, "train.py")
    assert any("does NOT fit" in n and card.name in n for n in bundle.notes)
    assert estimates == ["hf"]


def test_the_web_page_estimates_once_for_every_format_it_writes(estimates: list[str]) -> None:
    from tuneplan.web import plans
    from tuneplan.web.form import DEFAULTS

    values = {**DEFAULTS, "method": "lora", "gpus": 2, "zero": "2", "gpu": "a100-80gb-sxm4"}
    paths, msg = plans.export_files(values, ["hf-script", "accelerate", "deepspeed"])
    # train.py, the accelerate YAML, the DeepSpeed JSON, and the ZeRO-2 JSON both others point at
    assert "file(s)" in msg and len(paths) == 4
    assert len(estimates) == 1
