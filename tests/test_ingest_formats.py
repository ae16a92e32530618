"""Reading axolotl, TrainingArguments + PEFT + bitsandbytes, DeepSpeed and accelerate configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneplan.errors import TuneplanError
from tuneplan.ingest import detect_kind, read_config, read_configs
from tuneplan.ingest.document import json_key_lines, load_document

CFG = Path(__file__).parent / "fixtures" / "configs"


def test_axolotl_qlora_example() -> None:
    r = read_configs([str(CFG / "axolotl" / "qlora.yml")])
    assert r.model == "meta-llama/Meta-Llama-3-8B"
    expected = {"framework": "hf", "method": "qlora", "bits": 4, "rank": 32, "alpha": 16, "dropout": 0.05,
                "targets": "all-linear", "seq": 4096, "batch": 2, "grad_accum": 4, "optimizer": "paged-adamw",
                "gradient_checkpointing": True, "attn": "flash"}
    assert {k: r.setup_kw[k] for k in expected} == expected
    # bf16: auto is a choice axolotl makes per card: left to the card (said, not hidden)
    assert "precision" not in r.setup_kw
    assert [w for w in r.warnings if "`bf16`" in w and "auto" in w]
    assert r.run["num_epochs"] == 4.0


def test_axolotl_bf16_auto_follows_the_card() -> None:
    from tuneplan.api import estimate

    r = read_configs([str(CFG / "axolotl" / "qlora.yml")])
    on_v100 = estimate(r.model, r.base_setup(), gpu="v100-32gb", **r.setup_kw)  # CC 7.0: no bf16
    on_a100 = estimate(r.model, r.base_setup(), gpu="a100-80gb", **r.setup_kw)
    assert (on_v100.setup.precision, on_a100.setup.precision) == ("fp16-mixed", "bf16-mixed")


def test_axolotl_8bit_lora_warns_about_modules_to_save() -> None:
    r = read_configs([str(CFG / "axolotl" / "lora-8b.yml")])
    assert (r.setup_kw["method"], r.setup_kw["bits"], r.setup_kw["optimizer"]) == ("qlora", 8, "adamw-8bit")
    [w] = [w for w in r.warnings if "lora_modules_to_save" in w]
    assert "lora-8b.yml:23" in w and "not modelled" in w  # the key's line in the fixture


def test_axolotl_fsdp_qlora() -> None:
    r = read_configs([str(CFG / "axolotl" / "qlora-fsdp.yaml")], {"gpus": 8})
    assert (r.setup_kw["fsdp"], r.setup_kw["offload"], r.setup_kw["seq"]) == (True, "all", 512)


def test_axolotl_defaults(tmp_path: Path) -> None:
    f = tmp_path / "a.yml"
    f.write_text("base_model: Qwen/Qwen2.5-7B\nadapter: lora\nlora_r: 8\nlora_target_linear: true\n"
                 "datasets:\n  - path: x\n    type: alpaca\n")
    r = read_configs([str(f)])
    # axolotl schema defaults: sequence_len 512, micro_batch_size 1, gradient_checkpointing false
    assert (r.setup_kw["seq"], r.setup_kw["batch"], r.setup_kw["gradient_checkpointing"]) == (512, 1, False)


def test_training_args_with_peft_and_bnb_configs() -> None:
    files = [str(CFG / "hf" / n) for n in ("training_args.json", "adapter_config.json", "bnb_config.json")]
    r = read_configs(files, {"seq": 1024})
    expected = {"framework": "hf", "batch": 4, "grad_accum": 4, "optimizer": "paged-adamw-8bit",
                "gradient_checkpointing": True, "precision": "bf16-mixed", "rank": 16, "alpha": 32,
                "dropout": 0.05, "method": "qlora", "bits": 4, "quant_type": "nf4", "double_quant": True,
                "seq": 1024}
    assert {k: r.setup_kw[k] for k in expected} == expected
    assert set(r.setup_kw["targets"].split(",")) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert r.model == "Qwen/Qwen2.5-7B-Instruct"  # from adapter_config.json base_model_name_or_path
    # the bitsandbytes config's 4-bit wins over the adapter config's plain "lora"; precision comes from
    # the TrainingArguments' bf16 (the bnb compute dtype is only a hint)
    assert r.sources["method"].startswith("bitsandbytes config")
    assert r.sources["precision"].startswith("hf training args")
    assert not any("sequence length" in w for w in r.warnings)  # --seq given: nothing missing
    alone = read_configs(files)
    assert sum("sequence length" in w for w in alone.warnings) == 1  # TrainingArguments has none: said once
    assert not any("`use_bdlora`" in w or "`kasa_config`" in w for w in r.warnings)  # unset switches


def test_trl_sft_yaml(tmp_path: Path) -> None:
    f = tmp_path / "sft.yaml"
    f.write_text("model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct\ndataset_name: trl-lib/Capybara\n"
                 "learning_rate: 2.0e-4\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 8\n"
                 "max_length: 2048\ngradient_checkpointing: true\nbf16: true\nuse_peft: true\nlora_r: 32\n"
                 "lora_alpha: 16\nlora_target_modules: all-linear\nload_in_4bit: true\n"
                 "attn_implementation: flash_attention_2\noutput_dir: out\n")
    r = read_configs([str(f)])
    expected = {"method": "qlora", "bits": 4, "rank": 32, "targets": "all-linear", "seq": 2048, "batch": 2,
                "grad_accum": 8, "attn": "flash", "precision": "bf16-mixed"}
    assert {k: r.setup_kw[k] for k in expected} == expected
    assert r.model == "Qwen/Qwen2.5-1.5B-Instruct"


def test_deepspeed_json_alone() -> None:
    r = read_configs([str(CFG / "llamafactory" / "examples" / "deepspeed" / "ds_z2_offload_config.json")],
                     {"gpus": 2})
    assert (r.setup_kw["zero"], r.setup_kw["offload"]) == (2, "optimizer")
    assert "batch" not in r.setup_kw and "precision" not in r.setup_kw  # "auto": the Trainer's values decide
    assert r.deepspeed["buckets"]["reduce_bucket_size"] == 500_000_000  # 5e8 in the file


def test_deepspeed_overlap_comm_reaches_the_setup(tmp_path: Path) -> None:
    """ZeRO-1/2 with overlap_comm keep a second reduce bucket (stage_1_and_2 setup_buckets' buf_1): the
    flag becomes a setup field the estimate counts, not a "not modelled" warning; off by default."""
    import json

    def ds(stage: int, overlap: bool | None) -> Path:
        zo: dict = {"stage": stage, "reduce_bucket_size": 200_000_000}
        if overlap is not None:
            zo["overlap_comm"] = overlap
        f = tmp_path / f"z{stage}_{overlap}.json"
        f.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zo}))
        return f

    on = read_configs([str(ds(2, True))], {"gpus": 2})
    assert on.setup_kw["ds_overlap_comm"] is True and "z2_True.json" in on.sources["ds_overlap_comm"]
    assert not [w for w in on.warnings if "overlap_comm" in w]
    assert "ds_overlap_comm" not in read_configs([str(ds(2, False))], {"gpus": 2}).setup_kw
    assert "ds_overlap_comm" not in read_configs([str(ds(2, None))], {"gpus": 2}).setup_kw
    # stage 3: one bucket
    assert "ds_overlap_comm" not in read_configs([str(ds(3, True))], {"gpus": 2}).setup_kw


def test_accelerate_fsdp_example() -> None:
    r = read_configs([str(CFG / "accelerate" / "fsdp_config.yaml")])
    expected = {"gpus": 2, "nodes": 1, "precision": "fp16-mixed", "fsdp": True, "offload": "all", "zero": 0}
    assert {k: r.setup_kw[k] for k in expected} == expected


def test_accelerate_deepspeed_inline() -> None:
    r = read_configs([str(CFG / "accelerate" / "deepspeed_zero3.yaml")])
    # num_processes is the total over machines: 16 processes on 2 machines = 8 GPUs per node
    expected = {"nodes": 2, "gpus": 8, "zero": 3, "offload": "optimizer", "grad_accum": 4,
                "precision": "bf16-mixed"}
    assert {k: r.setup_kw[k] for k in expected} == expected


def test_conflicting_files_later_wins_with_a_warning(tmp_path: Path) -> None:
    a = tmp_path / "ds.json"
    a.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}))
    r = read_configs([str(CFG / "llamafactory" / "examples" / "train_qlora" / "qwen2.5_lora_sft_otfq.yaml"),
                      str(a)], {"gpus": 2})
    assert r.setup_kw["batch"] == 4
    assert any("batch" in w and "says 2" in w and "says 4" in w for w in r.warnings)


def test_kind_can_be_forced(tmp_path: Path) -> None:
    f = tmp_path / "weird.json"
    f.write_text(json.dumps({"zero_optimization": {"stage": 1}, "learning_rate": 1}))
    assert read_config(f"deepspeed:{f}").kind == "deepspeed"


def test_model_config_names_the_model(tmp_path: Path) -> None:
    from .conftest import TINY_LLAMA

    f = tmp_path / "config.json"
    f.write_text(json.dumps(TINY_LLAMA))
    r = read_configs([str(f), str(CFG / "accelerate" / "fsdp_config.yaml")])
    assert r.model == str(f)


def test_json_key_lines_by_path() -> None:
    text = ('{\n  "a": 1,\n  "z": {\n    "stage": 3,\n    "s": "x:y"\n  },\n'
            '  "l": [\n    1,\n    {"k": 2}\n  ]\n}\n')
    lines = json_key_lines(text)
    assert lines[("a",)] == 2 and lines[("z", "stage")] == 4 and lines[("z", "s")] == 5
    assert lines[("l", 0)] == 8 and lines[("l", 1, "k")] == 9


@pytest.mark.parametrize("name,where", [
    ("bad_indent.yaml", "bad_indent.yaml:3"),
    ("missing_comma.json", "missing_comma.json:4"),
    ("bad_stage.json", "bad_stage.json:5"),
    ("list.yaml", "mapping"),
    ("unknown_kind.yaml", "cannot tell what kind"),
])
def test_malformed_files_get_a_clear_error(name: str, where: str) -> None:
    with pytest.raises(TuneplanError) as e:
        read_configs([str(CFG / "bad" / name)])
    assert where in str(e.value) and name in str(e.value)


def test_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(TuneplanError, match="no such file"):
        load_document(tmp_path / "nope.yaml")
    b = tmp_path / "b.yaml"
    b.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TuneplanError, match="UTF-8"):
        load_document(b)


def test_detection_of_each_fixture() -> None:
    kinds = {"axolotl/qlora.yml": "axolotl", "hf/training_args.json": "hf-args",
             "hf/adapter_config.json": "peft", "hf/bnb_config.json": "bitsandbytes",
             "accelerate/fsdp_config.yaml": "accelerate", "llamafactory/ds_explicit.json": "deepspeed",
             "llamafactory/qwen2.5_lora_explicit_ds.yaml": "llamafactory"}
    for rel, kind in kinds.items():
        assert detect_kind(load_document(CFG / rel)) == kind, rel


def test_kernel_switches_reach_the_setup(tmp_path: Path) -> None:
    # axolotl: Liger's fused loss and torch.compile; a TRL SFTConfig: activation offloading
    ax = tmp_path / "axolotl.yml"
    ax.write_text("base_model: meta-llama/Meta-Llama-3-8B\nadapter: lora\nlora_r: 8\nsequence_len: 2048\n"
                  "micro_batch_size: 1\nliger_fused_linear_cross_entropy: true\ntorch_compile: true\n")
    r = read_configs([str(ax)])
    assert (r.setup_kw["loss"], r.setup_kw["compile"]) == ("fused-linear", True)
    assert not [w for w in r.warnings if "liger_fused_linear_cross_entropy" in w and "not modelled" in w]
    trl = tmp_path / "sft.json"
    trl.write_text(json.dumps({"per_device_train_batch_size": 2, "activation_offloading": True,
                               "use_liger_kernel": False, "bf16": True}))
    t = read_configs([str(trl)])
    assert t.setup_kw["activation_offload"] is True
    assert "loss" not in t.setup_kw  # a switch left off changes nothing
