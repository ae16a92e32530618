"""Reading LLaMA-Factory training YAMLs (fixtures in the shape of its published examples)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneplan.api import estimate
from tuneplan.errors import TuneplanError
from tuneplan.ingest import read_configs

CFG = Path(__file__).parent / "fixtures" / "configs"
LF = CFG / "llamafactory"
OTFQ = LF / "examples" / "train_qlora" / "qwen2.5_lora_sft_otfq.yaml"
DS3 = LF / "examples" / "train_lora" / "qwen2.5_lora_sft_ds3.yaml"
FULL_OFFLOAD = LF / "examples" / "train_full" / "qwen2.5_full_sft_ds2_offload.yaml"
UNKNOWN = LF / "examples" / "train_lora" / "llama3_freeze_unknown_keys.yaml"
EXPLICIT = LF / "qwen2.5_lora_explicit_ds.yaml"


def line_of(path: Path, key: str) -> int:
    """The fixture's own line of ``key:`` (counted here, not by the reader)."""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.split("#")[0].strip().startswith(f"{key}:"):
            return n
    raise AssertionError(key)


def test_qlora_example_maps_every_setting_with_its_line() -> None:
    r = read_configs([str(OTFQ)])
    assert r.model == "Qwen/Qwen2.5-7B-Instruct"
    expected = {"framework": "llamafactory", "method": "qlora", "bits": 4, "rank": 16, "targets": "all",
                "seq": 1024, "batch": 2, "grad_accum": 8, "precision": "bf16-mixed",
                "gradient_checkpointing": True}
    assert {k: r.setup_kw[k] for k in expected} == expected
    for field, key in (("rank", "lora_rank"), ("seq", "cutoff_len"), ("batch", "per_device_train_batch_size"),
                       ("grad_accum", "gradient_accumulation_steps"), ("bits", "quantization_bit"),
                       ("precision", "bf16")):
        assert r.sources[field] == f"llamafactory yaml {OTFQ}:{line_of(OTFQ, key)}"
    assert r.warnings == []  # logging, data, schedule keys are ignored silently
    assert r.run["num_train_epochs"] == 3.0 and r.run["max_samples"] == 1000


def test_llamafactory_defaults_fill_what_the_file_leaves_out(tmp_path: Path) -> None:
    # LLaMA-Factory 0.9.5 defaults: lora_rank 8, lora_target all, cutoff_len 2048, checkpointing on; the
    # Trainer's per_device_train_batch_size 8.
    f = tmp_path / "min.yaml"
    f.write_text("model_name_or_path: Qwen/Qwen2.5-7B\nstage: sft\nfinetuning_type: lora\nbf16: true\n")
    r = read_configs([str(f)])
    assert ((r.setup_kw["rank"], r.setup_kw["targets"], r.setup_kw["seq"], r.setup_kw["batch"])
            == (8, "all", 2048, 8))
    assert r.setup_kw["gradient_checkpointing"] is True
    assert "lora_rank unset" in r.sources["rank"] and "cutoff_len unset" in r.sources["seq"]


def test_no_precision_flag_means_no_autocast(tmp_path: Path) -> None:
    f = tmp_path / "noprec.yaml"
    f.write_text("model_name_or_path: Qwen/Qwen2.5-7B\nfinetuning_type: full\ncutoff_len: 512\n")
    assert read_configs([str(f)]).setup_kw["precision"] == "fp32"
    f.write_text("model_name_or_path: Qwen/Qwen2.5-7B\nfinetuning_type: lora\npure_bf16: true\n")
    assert read_configs([str(f)]).setup_kw["precision"] == "bf16"


def test_deepspeed_named_in_the_yaml_is_found_and_auto_buckets_resolved() -> None:
    # The YAML names examples/deepspeed/ds_z3_config.json relative to the LLaMA-Factory root, two folders up.
    r = read_configs([str(DS3)], {"gpus": 4})
    assert (r.setup_kw["zero"], r.setup_kw["offload"], r.setup_kw["gpus"]) == (3, "none", 4)
    assert (r.sources["zero"].startswith("deepspeed json ")
            and r.sources["zero"].endswith("ds_z3_config.json:19"))
    assert r.sources["gpus"] == "flag"
    h = 3584  # Qwen2.5-7B hidden_size; transformers fills "auto" with h*h, 0.9*h*h, 10*h
    b = r.deepspeed["buckets"]
    assert b["reduce_bucket_size"] == 12_845_056 == h * h
    assert b["stage3_prefetch_bucket_size"] == 11_560_550 == int(0.9 * h * h)
    assert b["stage3_param_persistence_threshold"] == 35_840
    assert b["stage3_max_live_parameters"] == 1_000_000_000  # 1e9 written as a float in the JSON
    # the resolved buckets reach the estimate (DeepSpeed's defaults would be 5e8 and 5e7 elements)
    assert r.setup_kw["ds_reduce_bucket"] == h * h and r.setup_kw["ds_prefetch_bucket"] == int(0.9 * h * h)
    assert "auto" in r.sources["ds_reduce_bucket"]


def test_zero3_without_gpu_count_asks_for_gpus() -> None:
    with pytest.raises(TuneplanError) as e:
        read_configs([str(DS3)])
    msg = str(e.value)
    assert "give gpus=N" in msg and "ds_z3_config.json:19" in msg  # the API names the field
    from tuneplan.cli.render import error_text

    assert error_text(e.value).startswith("--zero: ") and "give --gpus N" in error_text(e.value)  # the CLI


def test_full_offload_example() -> None:
    r = read_configs([str(FULL_OFFLOAD)], {"gpus": 2})
    assert (r.setup_kw["method"], r.setup_kw["zero"], r.setup_kw["offload"]) == ("full", 2, "optimizer")
    assert r.model == "Qwen/Qwen2.5-1.5B-Instruct"


def test_yaml_with_deepspeed_json_beside_it_equals_the_same_flags() -> None:
    """A LLaMA-Factory YAML with its DeepSpeed JSON gives the answer of the equivalent flags."""
    r = read_configs([str(EXPLICIT)])
    # DeepSpeed's train_batch_size 32 = micro-batch 2 x accumulation 4 x 4 GPUs
    assert r.setup_kw["gpus"] == 4 and "train_batch_size" in r.sources["gpus"]
    from_files = estimate(r.model, r.base_setup(), gpu="a100-80gb", **r.setup_kw)
    by_hand = estimate("Qwen/Qwen2.5-7B-Instruct", gpu="a100-80gb", framework="llamafactory", method="lora",
                       rank=32, targets="q_proj,k_proj,v_proj,o_proj", seq=4096, batch=2, grad_accum=4,
                       precision="bf16-mixed", attn="flash", zero=2, gpus=4, gradient_checkpointing=True)
    assert from_files.breakdown == by_hand.breakdown
    assert from_files.setup.to_dict() == by_hand.setup.to_dict()
    assert from_files.fits == by_hand.fits


def test_unmodelled_and_unknown_keys_warn_with_their_line() -> None:
    r = read_configs([str(UNKNOWN)])
    assert r.setup_kw["method"] == "freeze" and r.setup_kw["freeze_trainable_layers"] == 4
    assert r.setup_kw["attn"] == "flash" and r.setup_kw["optimizer"] == "adamw"
    for key in ("enable_liger_kernel", "use_galore", "neftune_noise_alpha", "my_custom_switch"):
        hits = [w for w in r.warnings if f"`{key}`" in w]
        assert len(hits) == 1, key
        assert hits[0].startswith(f"{UNKNOWN}:{line_of(UNKNOWN, key)}:")
    assert "not modelled" in next(w for w in r.warnings if "neftune_noise_alpha" in w)
    assert not any(k in w for w in r.warnings for k in ("`template`", "`dataset`", "`learning_rate`"))


def test_missing_deepspeed_file_takes_stage_from_its_name(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_text("model_name_or_path: Qwen/Qwen2.5-7B\nfinetuning_type: full\nbf16: true\n"
                 "deepspeed: examples/deepspeed/ds_z3_offload_config.json\n")
    r = read_configs([str(f)], {"gpus": 8})
    assert (r.setup_kw["zero"], r.setup_kw["offload"]) == (3, "all")
    assert any("not found" in w and f"{f}:4" in w for w in r.warnings)


def test_flags_override_the_file() -> None:
    r = read_configs([str(OTFQ)], {"rank": 64, "seq": 4096})
    assert (r.setup_kw["rank"], r.setup_kw["seq"]) == (64, 4096)
    assert r.sources["rank"] == r.sources["seq"] == "flag"
    assert r.sources["batch"].startswith("llamafactory yaml")


@pytest.mark.parametrize("name,line,needle", [
    ("bad_rank.yaml", 4, "lora_rank"),
    ("oft.yaml", 3, "finetuning_type"),
])
def test_bad_values_name_file_line_and_key(name: str, line: int, needle: str) -> None:
    with pytest.raises(TuneplanError) as e:
        read_configs([str(CFG / "bad" / name)])
    assert f"{name}:{line}" in str(e.value) and needle in str(e.value)


def test_quantized_full_finetune_is_refused_with_its_line(tmp_path: Path) -> None:
    f = tmp_path / "q.yaml"
    f.write_text("model_name_or_path: Qwen/Qwen2.5-7B\nfinetuning_type: full\nquantization_bit: 4\n")
    with pytest.raises(TuneplanError, match=r"q\.yaml:3"):
        read_configs([str(f)])


def test_targets_the_model_lacks_name_the_line(tmp_path: Path) -> None:
    f = tmp_path / "t.yaml"
    f.write_text("model_name_or_path: Qwen/Qwen2.5-7B\nfinetuning_type: lora\nlora_target: c_attn,q_proj\n")
    with pytest.raises(TuneplanError) as e:
        read_configs([str(f)])
    assert "c_attn" in str(e.value) and "t.yaml:3" in str(e.value) and e.value.field == "targets"
