"""ingest/common.py: the collector every reader uses, and the shared TrainingArguments translations."""

from __future__ import annotations

import math

import pytest

from tuneplan.errors import ConfigError
from tuneplan.ingest.common import (
    HF_OPTIMIZERS,
    OPTIMIZER_TO_HF,
    Collector,
    map_fsdp,
    map_hf_training,
    map_kernel_switches,
    map_optimizer,
    map_plain,
    map_precision,
)
from tuneplan.ingest.document import Document
from tuneplan.specs.setup import OPTIMIZERS


def collector(data: dict, lines: dict | None = None) -> Collector:
    return Collector(Document(path="train.yaml", data=data, fmt="yaml", lines=lines or {}), "hf-args",
                     "transformers args")


# ---- values ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [(4, 4), (4.0, 4), ("5e8", 500_000_000), (1e9, 10**9)])
def test_as_int_accepts_integral_numbers_and_yaml_strings(value, expected):
    # YAML 1.1 reads 5e8 as a string; JSON writes 1e9 as a float
    assert collector({}).as_int(value, "k") == expected


@pytest.mark.parametrize("value", [2.5, math.nan, math.inf, "abc", True, None, [1], "1" * 100])
def test_as_int_refuses_non_integers_naming_the_key(value):
    with pytest.raises(ConfigError) as err:
        collector({}).as_int(value, "micro_batch")
    assert err.value.field == "micro_batch"
    assert "train.yaml" in err.value.message


def test_as_int_minimum():
    c = collector({})
    assert c.as_int(0, "k", minimum=0) == 0
    with pytest.raises(ConfigError, match="must be >= 1"):
        c.as_int(0, "k")


@pytest.mark.parametrize("value, expected", [(True, True), (False, False), ("yes", True), ("FALSE", False),
                                             ("true", True), ("no", False)])
def test_as_bool(value, expected):
    assert collector({}).as_bool(value, "k") is expected


@pytest.mark.parametrize("value", [1, 0, "on", None, "maybe"])
def test_as_bool_refuses_the_rest(value):
    with pytest.raises(ConfigError) as err:
        collector({}).as_bool(value, "k")
    assert err.value.accepted == "true, false"


def test_as_float():
    c = collector({})
    assert c.as_float("0.05", "k") == 0.05 and c.as_float(3, "k") == 3.0
    for bad in (math.nan, "inf", True, "x", None, 10**400):
        with pytest.raises(ConfigError):
            c.as_float(bad, "k")


def test_fail_and_warn_point_at_the_line_when_known():
    c = collector({"bf16": 1}, lines={("bf16",): 7})
    assert c.fail("bf16", "bad").message == "train.yaml:7: `bf16`: bad"
    c.warn(("zero", "stage"), "hm")  # no line known: the dotted key stands in
    assert c.out.warnings == ["train.yaml:zero.stage: `zero.stage`: hm"]


# ---- recording ---------------------------------------------------------------------------------------

def test_set_records_source_and_weakness():
    c = collector({"rank": 8}, lines={("rank",): 3})
    c.set("rank", 8, "rank", weak=True)
    assert c.out.fields == {"rank": 8}
    assert c.out.sources["rank"] == "transformers args train.yaml:3"
    assert c.out.weak == {"rank"}
    c.set("rank", 16, "rank")  # a firm value replaces the hint
    assert c.out.fields["rank"] == 16 and c.out.weak == set()


def test_default_and_set_model():
    c = collector({})
    c.default("attn", "sdpa", "the Trainer's default")
    assert c.out.sources["attn"] == "transformers args train.yaml (the Trainer's default)"
    c.set_model("  Qwen/Qwen2.5-7B  ", "model_name_or_path")
    assert c.out.model == "Qwen/Qwen2.5-7B"
    for bad in ("", "   ", 3, None):
        with pytest.raises(ConfigError):
            c.set_model(bad, "model_name_or_path")


def test_finish_warns_only_about_unhandled_keys_that_say_something():
    c = collector({"used": 1, "log_every": 5, "quiet": "x", "flag_off": False, "unknown": 3, "nm": 2,
                   "nm_off": 0})
    c.get("used")
    out = c.finish(frozenset({"quiet"}), ("log_",), {"nm": "not counted", "nm_off": "not counted"}, "ignored")
    assert out.warnings == ["train.yaml:unknown: `unknown`: ignored",
                            "train.yaml:nm: `nm`: not modelled: not counted"]


# ---- translations ------------------------------------------------------------------------------------

def test_optimizer_tables_round_trip_and_cover_every_optimizer():
    assert set(OPTIMIZER_TO_HF) == set(OPTIMIZERS)
    for ours, hf in OPTIMIZER_TO_HF.items():
        assert HF_OPTIMIZERS[hf] == ours


@pytest.mark.parametrize("bf16, fp16, expected", [(True, False, "bf16-mixed"), (False, True, "fp16-mixed"),
                                                  (False, False, "fp32"), (None, None, None),
                                                  ("true", None, "bf16-mixed")])
def test_map_precision_follows_the_trainers_autocast(bf16, fp16, expected):
    c = collector({})
    map_precision(c, bf16, fp16)
    assert c.out.fields.get("precision") == expected


def test_map_precision_refuses_both_like_the_trainer():
    with pytest.raises(ConfigError) as err:
        map_precision(collector({}), True, True)
    assert err.value.field == "fp16"


def test_map_precision_off_means_fp32_only_when_asked():
    c = collector({})
    map_precision(c, False, None, unset_means_fp32=False)
    assert "precision" not in c.out.fields


def test_map_optimizer():
    c = collector({})
    map_optimizer(c, "ADAMW_TORCH_FUSED", "optim")
    assert c.out.fields["optimizer"] == "adamw-fused"
    c2 = collector({})
    map_optimizer(c2, "lion_32bit", "optim")
    assert "optimizer" not in c2.out.fields and "not modelled" in c2.out.warnings[0]
    with pytest.raises(ConfigError):
        map_optimizer(collector({}), 3, "optim")


@pytest.mark.parametrize("value, fsdp, offload", [
    ("full_shard auto_wrap", True, None),
    (["full_shard", "offload"], True, "all"),
    ("shard_grad_op", True, None),  # estimated as full sharding, with a warning
    ("no_shard", False, None),
    ("", None, None),
    (False, None, None),
])
def test_map_fsdp(value, fsdp, offload):
    c = collector({})
    map_fsdp(c, value, "fsdp")
    assert c.out.fields.get("fsdp") == fsdp
    assert c.out.fields.get("offload") == offload


def test_map_fsdp_refuses_a_number():
    with pytest.raises(ConfigError):
        map_fsdp(collector({}), 3, "fsdp")


def test_map_kernel_switches():
    c = collector({"use_liger_kernel": True, "torch_compile": "false", "chunked_cross_entropy": None})
    map_kernel_switches(c)
    assert c.out.fields == {"loss": "fused-linear"}  # compile off, the None switch left alone
    assert len(c.out.warnings) == 1


def test_map_plain_reads_the_field_tables_keys():
    c = collector({"per_device_train_batch_size": 4, "gradient_accumulation_steps": "8", "r": 32,
                   "gradient_checkpointing": "true"})
    done = map_plain(c, "transformers", "lora")
    assert c.out.fields == {"batch": 4, "grad_accum": 8, "rank": 32, "gradient_checkpointing": True}
    assert done == {"batch", "grad_accum", "rank", "gradient_checkpointing"}


def test_map_plain_skips_method_specific_keys_for_other_methods():
    c = collector({"r": 32, "per_device_train_batch_size": 2})
    map_plain(c, "transformers", "full")
    assert c.out.fields == {"batch": 2}


def test_map_plain_current_spelling_wins():
    # TRL renamed SFTConfig.max_seq_length to max_length; the current name wins over the old one
    c = collector({"max_seq_length": 1024, "max_length": 2048})
    map_plain(c, "transformers")
    assert c.out.fields["seq"] == 2048


def test_map_plain_leaves_skipped_values_to_another_file():
    c = collector({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2})
    map_plain(c, "deepspeed", skip=("auto",))
    assert c.out.fields == {"grad_accum": 2}


def test_map_hf_training_collects_the_run_length():
    c = collector({"optim": "sgd", "num_train_epochs": 3, "max_steps": "100"})
    map_hf_training(c)
    assert c.out.fields["optimizer"] == "sgd"
    assert c.out.extras["run"] == {"num_train_epochs": 3.0, "max_steps": 100.0}
