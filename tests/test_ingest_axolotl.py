"""ingest/axolotl.py: an axolotl YAML read into the run it describes, with axolotl's own defaults."""

from __future__ import annotations

import pytest

from tuneplan.errors import ConfigError
from tuneplan.ingest.axolotl import read_axolotl
from tuneplan.ingest.document import Document

BASE = {"base_model": "meta-llama/Llama-3.1-8B"}


def read(data: dict):
    return read_axolotl(Document(path="ax.yml", data={**BASE, **data}, fmt="yaml"))


def test_qlora_with_4_bit_base():
    out = read({"adapter": "qlora", "load_in_4bit": True, "lora_r": 32, "lora_alpha": 16,
                "lora_target_linear": True, "micro_batch_size": 2, "sequence_len": 2048,
                "gradient_accumulation_steps": 4, "optimizer": "paged_adamw_8bit"})
    f = out.fields
    assert (f["method"], f["bits"], f["rank"], f["alpha"]) == ("qlora", 4, 32, 16)
    assert (f["targets"], f["batch"], f["seq"], f["grad_accum"]) == ("all-linear", 2, 2048, 4)
    assert f["optimizer"] == "paged-adamw-8bit"
    assert out.model == "meta-llama/Llama-3.1-8B"


def test_lora_on_an_8_bit_base_is_qlora_8():
    out = read({"adapter": "lora", "load_in_8bit": True, "lora_r": 8,
                "lora_target_modules": ["q_proj", "v_proj"]})
    assert (out.fields["method"], out.fields["bits"], out.fields["targets"]) == ("qlora", 8, "q_proj,v_proj")


def test_axolotls_defaults_fill_what_is_left_out():
    # axolotl schema: sequence_len 512, micro_batch_size 1, gradient_checkpointing false
    out = read({})
    assert out.fields["method"] == "full"
    assert (out.fields["seq"], out.fields["batch"], out.fields["gradient_checkpointing"]) == (512, 1, False)
    assert "axolotl uses 512" in out.sources["seq"]


def test_lora_rank_and_targets_left_out_warn():
    out = read({"adapter": "lora"})
    text = "\n".join(out.warnings)
    assert "no lora_r" in text and "no LoRA targets" in text
    assert "rank" not in out.fields and "targets" not in out.fields


@pytest.mark.parametrize("data, field", [
    ({"adapter": "qlora"}, "adapter"),  # axolotl refuses qlora without load_in_4bit
    ({"adapter": "ia3"}, "adapter"),
    ({"load_in_4bit": True}, "load_in_4bit"),  # a quantized base cannot be fully fine-tuned
])
def test_refusals_name_the_key(data, field):
    with pytest.raises(ConfigError) as err:
        read(data)
    assert err.value.field == field


@pytest.mark.parametrize("data, precision", [
    ({"bf16": True}, "bf16-mixed"), ({"fp16": True}, "fp16-mixed"), ({"bfloat16": True}, "bf16"),
    ({"float16": True}, "fp16"), ({"bf16": False}, "fp32"), ({"bf16": "auto"}, None), ({}, None),
])
def test_precision(data, precision):
    assert read(data).fields.get("precision") == precision


def test_offloaded_checkpointing_counts_as_checkpointing_with_a_warning():
    out = read({"gradient_checkpointing": "offload"})
    assert out.fields["gradient_checkpointing"] is True
    assert any("offload" in w for w in out.warnings)


@pytest.mark.parametrize("key, attn", [("flash_attention", "flash"), ("sdp_attention", "sdpa"),
                                       ("eager_attention", "eager")])
def test_attention_switches(key, attn):
    assert read({key: True}).fields["attn"] == attn


def test_fsdp_config_and_deepspeed_reference():
    out = read({"fsdp_config": {"offload_params": True, "activation_checkpointing": True},
                "deepspeed": "zero3.json"})
    f = out.fields
    assert (f["fsdp"], f["offload"], f["gradient_checkpointing"]) == (True, "all", True)
    assert out.references[0][:2] == ("deepspeed", "zero3.json")
    inline = read({"deepspeed": {"zero_optimization": {"stage": 2}}})
    assert inline.extras["inline_deepspeed"] == {"zero_optimization": {"stage": 2}}


def test_run_length_and_packing():
    out = read({"num_epochs": 2, "max_steps": 100, "sample_packing": True})
    assert out.extras["run"] == {"num_epochs": 2.0, "max_steps": 100.0, "packing": True}


def test_unmodelled_options_warn():
    out = read({"peft_use_dora": True, "made_up_option": 1, "val_set_size": 0.1})
    text = "\n".join(out.warnings)
    assert "DoRA" in text and "made_up_option" in text and "val_set_size" not in text
