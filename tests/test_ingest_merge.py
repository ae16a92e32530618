"""ingest/merge.py: several config files and flags into one set of setup fields, each with its origin."""

from __future__ import annotations

import json

import pytest

from tuneplan.errors import ConfigError
from tuneplan.ingest.merge import Resolved, merge_from_files, read_configs


def write(tmp_path, name: str, data: dict) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(data) if name.endswith(".json") else "\n".join(
        f"{k}: {json.dumps(v)}" for k, v in data.items()) + "\n")
    return str(p)


def test_flags_win_over_files(tmp_path):
    ax = write(tmp_path, "ax.yml", {"base_model": "x/y", "micro_batch_size": 4, "sequence_len": 1024})
    r = read_configs([ax], {"batch": 2})
    assert r.setup_kw["batch"] == 2 and r.sources["batch"] == "flag"
    assert r.setup_kw["seq"] == 1024 and "ax.yml" in r.sources["seq"]


def test_a_later_file_wins_a_conflict_with_a_warning(tmp_path):
    ds = write(tmp_path, "ds.json", {"train_micro_batch_size_per_gpu": 2})
    ax = write(tmp_path, "ax.yml", {"base_model": "x/y", "micro_batch_size": 4})
    r = read_configs([ds, ax])
    assert r.setup_kw["batch"] == 4
    assert any("batch:" in w and "the later file" in w for w in r.warnings)
    r2 = read_configs([ax, ds])
    assert r2.setup_kw["batch"] == 2


def test_a_hint_fills_only_what_nothing_else_says(tmp_path):
    # DeepSpeed's own Adam is a hint; the training file's optimizer wins whatever the order
    ds = "deepspeed:" + write(tmp_path, "ds.json", {"optimizer": {"type": "AdamW"}})  # kind forced
    ax = write(tmp_path, "ax.yml", {"base_model": "x/y", "optimizer": "sgd"})
    assert read_configs([ax, ds]).setup_kw["optimizer"] == "sgd"
    assert read_configs([ds, ax]).setup_kw["optimizer"] == "sgd"
    assert read_configs([ds]).setup_kw["optimizer"] == "adamw"


def test_world_size_from_the_global_batch_sets_gpus(tmp_path):
    # DeepSpeed: train_batch_size = micro 2 x accumulation 4 x world 8
    ds = write(tmp_path, "ds.json", {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
                                     "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 2}})
    r = read_configs([ds])
    assert r.setup_kw["gpus"] == 8
    mismatch = read_configs([ds], {"gpus": 4})
    assert any("implies 8 GPUs" in w for w in mismatch.warnings)


def test_a_named_deepspeed_file_beside_the_training_file_is_read(tmp_path):
    write(tmp_path, "zero3.json", {"zero_optimization": {"stage": 3}})
    ax = write(tmp_path, "ax.yml", {"base_model": "x/y", "deepspeed": "zero3.json"})
    r = read_configs([ax], {"gpus": 2})
    assert r.setup_kw["zero"] == 3 and "zero3.json" in r.sources["zero"]
    assert r.deepspeed is not None and r.deepspeed["stage"] == 3


def test_a_missing_deepspeed_file_is_guessed_from_its_name(tmp_path):
    # LLaMA-Factory ships examples/deepspeed/ds_z3_offload_config.json
    ax = write(tmp_path, "ax.yml", {"base_model": "x/y", "deepspeed": "nowhere/ds_z3_offload_config.json"})
    r = read_configs([ax], {"gpus": 2})
    assert (r.setup_kw["zero"], r.setup_kw["offload"]) == (3, "all")
    assert any("not found" in w and "ZeRO-3 with offload" in w for w in r.warnings)


def test_a_missing_deepspeed_file_without_a_stage_in_its_name(tmp_path):
    ax = write(tmp_path, "ax.yml", {"base_model": "x/y", "deepspeed": "my_settings.json"})
    r = read_configs([ax])
    assert "zero" not in r.setup_kw
    assert any("estimated without DeepSpeed" in w for w in r.warnings)


def test_the_model_argument_overrides_the_files_with_a_warning(tmp_path):
    ax = write(tmp_path, "ax.yml", {"base_model": "a/b"})
    assert read_configs([ax]).model == "a/b"
    r = read_configs([ax], model="c/d")
    assert r.model == "c/d" and r.model_source == "argument"
    assert any("overrides" in w for w in r.warnings)


def test_auto_buckets_follow_the_models_hidden_size(tmp_path):
    # Qwen2.5-7B: hidden 3584; transformers fills reduce_bucket_size "auto" with hidden^2 = 12,845,056
    ds = write(tmp_path, "ds.json", {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})
    r = read_configs([ds], {"gpus": 2}, model="Qwen/Qwen2.5-7B-Instruct")
    assert r.setup_kw["ds_reduce_bucket"] == 3584 * 3584
    assert "auto" in r.sources["ds_reduce_bucket"]


def test_auto_buckets_without_a_model_warn(tmp_path):
    ds = write(tmp_path, "ds.json", {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})
    r = read_configs([ds], {"gpus": 2})
    assert "ds_reduce_bucket" not in r.setup_kw
    assert any("hidden size is unknown" in w for w in r.warnings)


def test_an_impossible_combination_names_the_file_it_came_from(tmp_path):
    ds = write(tmp_path, "z3.json", {"zero_optimization": {"stage": 3}})
    with pytest.raises(ConfigError) as err:
        read_configs([ds])  # ZeRO-3 on one GPU without offload
    assert err.value.field == "zero"
    assert "z3.json" in err.value.message and "{gpus=N}" in err.value.message


def test_an_impossible_flag_is_refused_without_a_file_source(tmp_path):
    with pytest.raises(ConfigError) as err:
        read_configs([], {"zero": 3})
    assert "value from" not in err.value.message


def test_merge_from_files_is_read_configs_in_a_tuple(tmp_path):
    ax = write(tmp_path, "ax.yml", {"base_model": "a/b", "micro_batch_size": 3})
    model, kw, sources, warnings = merge_from_files([ax], {"seq": 256})
    r = read_configs([ax], {"seq": 256})
    assert (model, kw, sources, warnings) == (r.model, r.setup_kw, r.sources, r.warnings)


def test_dataset_fields_from_max_steps():
    # steps x micro-batch x accumulation x GPUs x nodes: 100 x 2 x 4 x 8 x 1 = 6,400 rows, one pass
    r = Resolved(None, None, {"batch": 2, "grad_accum": 4, "gpus": 8}, {}, run={"max_steps": 100})
    fields, why = r.dataset_fields()
    assert fields == {"samples": 6_400, "epochs": 1.0} and "max_steps 100" in why


def test_dataset_fields_from_max_samples_and_none():
    r = Resolved(None, None, {}, {}, run={"max_samples": 5000, "num_train_epochs": 3.0, "packing": True})
    assert r.dataset_fields()[0] == {"samples": 5000, "epochs": 3.0, "packing": True}
    assert Resolved(None, None, {}, {}, run={"num_train_epochs": 3}).dataset_fields() is None
    # max_steps -1 is the Trainer's "not set"
    assert Resolved(None, None, {}, {}, run={"max_steps": -1}).dataset_fields() is None
