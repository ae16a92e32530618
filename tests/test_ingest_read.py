"""ingest/read.py: a config file's kind told from its keys (or forced with KIND:PATH), then read."""

from __future__ import annotations

import json

import pytest

from tuneplan.errors import ConfigError
from tuneplan.ingest.document import Document
from tuneplan.ingest.read import KINDS, detect_kind, read_config, read_inline_deepspeed, split_kind


def kind_of(data: dict) -> str:
    return detect_kind(Document(path="f.json", data=data, fmt="json"))


@pytest.mark.parametrize("data, kind", [
    ({"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}, "deepspeed"),
    ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}, "deepspeed"),
    ({"distributed_type": "FSDP", "num_processes": 8}, "accelerate"),
    ({"compute_environment": "LOCAL_MACHINE"}, "accelerate"),
    ({"model_type": "llama", "hidden_size": 4096}, "model-config"),
    ({"peft_type": "LORA", "r": 8}, "peft"),
    ({"r": 8, "target_modules": ["q_proj"]}, "peft"),
    ({"finetuning_type": "lora", "cutoff_len": 1024}, "llamafactory"),
    ({"base_model": "x", "micro_batch_size": 1}, "axolotl"),
    ({"per_device_train_batch_size": 4, "output_dir": "out"}, "hf-args"),
    ({"quant_method": "bitsandbytes"}, "bitsandbytes"),
    ({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "bitsandbytes"),
])
def test_detect_kind_from_each_formats_own_keys(data, kind):
    assert kind_of(data) == kind


def test_a_trainingarguments_file_with_deepspeed_keys_is_not_deepspeed():
    # a key only TrainingArguments has (output_dir) beside a DeepSpeed-looking one: TrainingArguments
    data = {"train_batch_size": 8, "output_dir": "out", "per_device_train_batch_size": 2}
    assert kind_of(data) == "hf-args"


def test_an_unknown_file_names_its_keys_and_the_kinds():
    with pytest.raises(ConfigError) as err:
        kind_of({"alpha": 1, "beta": 2})
    assert err.value.field == "from"
    assert "alpha, beta" in err.value.message
    assert all(k in err.value.accepted for k in KINDS)


@pytest.mark.parametrize("spec, expected", [
    ("deepspeed:ds.json", ("deepspeed", "ds.json")),
    ("ds.json", (None, "ds.json")),
    ("C:/configs/ds.json", (None, "C:/configs/ds.json")),  # not a kind: a path with a colon stays whole
    ("accelerate:a:b.yaml", ("accelerate", "a:b.yaml")),
])
def test_split_kind(spec, expected):
    assert split_kind(spec) == expected


def test_read_config_detects_and_forces(tmp_path):
    p = tmp_path / "zero.json"
    p.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert read_config(p).kind == "deepspeed"
    assert read_config(str(p)).fields["zero"] == 2
    q = tmp_path / "plain.json"
    q.write_text(json.dumps({"optimizer": {"type": "AdamW"}}))  # no kind-telling key
    with pytest.raises(ConfigError):
        read_config(q)
    assert read_config(f"deepspeed:{q}").kind == "deepspeed"
    assert read_config(q, kind="deepspeed").fields["optimizer"] == "adamw"


def test_read_config_refuses_an_unknown_forced_kind(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{}")
    with pytest.raises(ConfigError) as err:
        read_config(p, kind="megatron")
    assert err.value.field == "from" and "deepspeed" in err.value.accepted


def test_a_model_config_names_the_model_by_its_path(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2}))
    out = read_config(p)
    assert out.kind == "model-config" and out.model == str(p)


def test_read_inline_deepspeed():
    out = read_inline_deepspeed({"zero_optimization": {"stage": 3}}, "args.json:deepspeed")
    assert out.kind == "deepspeed" and out.fields["zero"] == 3
    assert "args.json:deepspeed" in out.sources["zero"]
