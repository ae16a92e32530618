"""export/llamafactory_yaml.py: the LLaMA-Factory YAML of a plan, read back by tuneplan's own LLaMA-Factory
reader as the same setup, and its values kept by a YAML 1.1 parser."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from tests.conftest import TINY_LLAMA
from tuneplan import estimate
from tuneplan.errors import TuneplanError
from tuneplan.export.llamafactory_yaml import (
    llamafactory_config,
    lora_target_value,
    render_llamafactory,
    template_for,
)
from tuneplan.ingest.read import read_config
from tuneplan.specs.model import model_from_config
from tuneplan.specs.setup import TrainSetup


@pytest.fixture(scope="module")
def tiny():
    return model_from_config(TINY_LLAMA, "tiny")


def test_template_for():
    llama2 = model_from_config(TINY_LLAMA, "l2")
    assert template_for(llama2) == "llama2"
    assert template_for(dataclasses.replace(llama2, vocab=128256)) == "llama3"  # Llama 3's vocabulary
    assert template_for(dataclasses.replace(llama2, model_type="qwen2")) == "qwen"
    assert template_for(dataclasses.replace(llama2, model_type="olmo")) == "default"


def test_lora_target_value(tiny):
    assert lora_target_value(tiny, "all-linear") == "all"
    assert lora_target_value(tiny, "v_proj,q_proj") == "q_proj,v_proj"  # in the model's module order


@pytest.mark.parametrize("fields", [
    {"method": "lora", "rank": 32, "alpha": 64, "dropout": 0.05, "batch": 4, "seq": 1024, "grad_accum": 2,
     "targets": "q_proj,v_proj", "gradient_checkpointing": True},
    {"method": "qlora", "bits": 4, "rank": 8, "batch": 1, "seq": 2048, "grad_accum": 16,
     "precision": "fp16-mixed", "optimizer": "paged-adamw-8bit", "gradient_checkpointing": False},
    {"method": "full", "precision": "bf16", "batch": 2, "seq": 512, "optimizer": "adamw"},
])
def test_round_trip_through_the_reader(tiny, tmp_path, fields):
    est = estimate(tiny, gpu="h100", **fields)
    path = tmp_path / "train.yaml"
    path.write_text(render_llamafactory(est))
    back = read_config(path)
    assert back.kind == "llamafactory"
    for name, value in fields.items():
        assert back.fields[name] == value, name


def test_render_is_the_config_as_yaml(tiny):
    est = estimate(tiny, gpu="h100", method="lora", dropout=0.0)
    loaded = yaml.safe_load(render_llamafactory(est))
    merged = {k: v for _, sec in llamafactory_config(est.model, est.setup, est.gpu) for k, v in sec.items()}
    assert loaded == merged
    assert loaded["learning_rate"] == 1.0e-4  # "1.0e-04": YAML 1.1 reads it as a float, not a string


@pytest.mark.parametrize("change, field", [({"precision": "fp16"}, "precision"),
                                           ({"precision": "fp32", "method": "lora"}, "precision"),
                                           ({"optimizer_in_backward": True}, "optimizer_in_backward"),
                                           ({"loss": "chunked"}, "loss")])
def test_what_llamafactory_cannot_express_is_refused(tiny, change, field):
    with pytest.raises(TuneplanError) as err:
        llamafactory_config(tiny, TrainSetup(**{"method": "lora", **change}))
    assert err.value.field == field


def test_multi_gpu_and_deepspeed_lines(tiny):
    est = estimate(tiny, gpu="h100", method="lora", gpus=4, zero=2)
    text = render_llamafactory(est, deepspeed_file="ds_z2.json")
    assert "# Launch: FORCE_TORCHRUN=1 NPROC_PER_NODE=4 llamafactory-cli train THIS_FILE" in text
    assert yaml.safe_load(text)["deepspeed"] == "ds_z2.json"
