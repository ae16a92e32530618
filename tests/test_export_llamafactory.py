"""LLaMA-Factory YAML export: every key and choice is one LLaMA-Factory 0.9.5 accepts.

LLaMA-Factory pins transformers<=5.6 / peft<=0.18, so it cannot live beside the test stack; its argument
names (its hparams dataclasses + the transformers 5.6 TrainingArguments it extends) are recorded in
fixtures/recorded/llamafactory_args.json by the script beside it, with both versions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tuneplan.api import estimate
from tuneplan.errors import TuneplanError
from tuneplan.export import build_export
from tuneplan.specs.setup import TrainSetup

REC = json.loads((Path(__file__).parent / "fixtures" / "recorded" / "llamafactory_args.json").read_text())
LF_KEYS = ({k for fields in REC["llamafactory_fields"].values() for k in fields}
           | set(REC["transformers_training_args"]))

PLANS = [
    dict(method="qlora", rank=16, batch=2, seq=1024, grad_accum=8),
    dict(method="qlora", bits=8, rank=8, targets="attn", batch=1, seq=4096, attn="flash",
         optimizer="paged-adamw-8bit"),
    dict(method="lora", rank=32, targets="q_proj,k_proj,v_proj,o_proj", batch=4, seq=2048, gpus=4, zero=3),
    dict(method="full", batch=1, seq=2048, gpus=8, zero=3, offload="all", optimizer="adamw"),
    dict(method="full", batch=1, seq=512, precision="fp32", optimizer="sgd", gradient_checkpointing=False),
    dict(method="freeze", freeze_trainable_layers=3, batch=2, seq=1024, precision="bf16", attn="eager"),
    dict(method="lora", batch=1, seq=4096, gpus=4, fsdp=True, offload="all", precision="fp16-mixed"),
]


def render(model, plan: dict) -> tuple[dict, str]:
    cfg, text, _ = render_with_setup(model, plan)
    return cfg, text


def render_with_setup(model, plan: dict) -> tuple[dict, str, TrainSetup]:
    b = build_export("llamafactory", estimate(model, TrainSetup(**plan)), "train.yaml",
                     dataset="alpaca_en_demo")
    text = b.files[0][1]
    return yaml.safe_load(text), text, b.setup  # b.setup: the plan with the profile's defaults filled


@pytest.mark.parametrize("plan", PLANS)
def test_keys_and_choices_are_llamafactorys(qwen7b, plan) -> None:
    cfg, _ = render(qwen7b, plan)
    assert set(cfg) <= LF_KEYS, set(cfg) - LF_KEYS
    ch = REC["choices"]
    for key in ("finetuning_type", "stage", "flash_attn", "quantization_method", "quantization_type", "optim",
                "lr_scheduler_type", "template"):
        if key in cfg:
            assert cfg[key] in ch[key], (key, cfg[key])


@pytest.mark.parametrize("plan", PLANS)
def test_values_are_the_plan(qwen7b, plan) -> None:
    cfg, _, s = render_with_setup(qwen7b, plan)
    assert cfg["model_name_or_path"] == qwen7b.name
    assert cfg["cutoff_len"] == plan["seq"] and cfg["per_device_train_batch_size"] == plan["batch"]
    assert cfg["gradient_accumulation_steps"] == plan.get("grad_accum", 1)
    m = plan["method"]
    assert cfg["finetuning_type"] == ("lora" if m in ("lora", "qlora") else m)
    if m == "qlora":
        assert cfg["quantization_bit"] == plan.get("bits", 4) and cfg["quantization_method"] == "bnb"
    else:
        assert "quantization_bit" not in cfg
    if m in ("lora", "qlora"):
        assert cfg["lora_rank"] == plan.get("rank", 16)
    if "zero" in plan:
        assert cfg["deepspeed"] == f"ds_z{plan['zero']}_config.json"
    prec = plan.get("precision", "bf16-mixed")
    assert cfg.get("bf16", False) == (prec == "bf16-mixed")
    assert cfg.get("fp16", False) == (prec == "fp16-mixed")
    assert cfg.get("pure_bf16", False) == (prec == "bf16")
    # checkpointing is written out either way (LLaMA-Factory would otherwise turn it on by itself)
    assert cfg["disable_gradient_checkpointing"] is (not s.gradient_checkpointing)
    assert cfg["optim"] == {"adamw": "adamw_torch", "adamw-fused": "adamw_torch_fused", "sgd": "sgd",
                            "paged-adamw-8bit": "paged_adamw_8bit"}[s.optimizer]


def test_lora_targets_are_module_names_of_the_model(qwen7b) -> None:
    cfg, _ = render(qwen7b, dict(method="lora", targets="attn"))
    assert cfg["lora_target"] == "q_proj,k_proj,v_proj,o_proj"  # Qwen2's attention projections
    cfg, _ = render(qwen7b, dict(method="lora", targets="all-linear"))
    assert cfg["lora_target"] == "all"


def test_companions(qwen7b) -> None:
    b = build_export("llamafactory", estimate(qwen7b, TrainSetup(method="lora", gpus=2, zero=2)),
                     "run/x.yaml")
    assert [p.as_posix() for p, _ in b.files] == ["run/x.yaml", "run/ds_z2_config.json"]
    b = build_export("llamafactory", estimate(qwen7b, TrainSetup(method="lora", gpus=2, fsdp=True)),
                     "run/x.yaml")
    assert [p.as_posix() for p, _ in b.files] == ["run/x.yaml", "run/x_accelerate.yaml"]
    assert "accelerate launch --config_file x_accelerate.yaml" in b.files[0][1]


def test_header_quotes_the_estimate(qwen7b) -> None:
    _, text = render(qwen7b, PLANS[0])
    assert text.startswith("# Written by tuneplan") and "Estimated per-GPU peak" in text


@pytest.mark.parametrize("plan,field", [
    (dict(method="lora", precision="fp32"), "precision"),
    (dict(method="full", precision="fp16"), "precision"),
])
def test_plans_llamafactory_cannot_express(qwen7b, plan, field) -> None:
    with pytest.raises(TuneplanError) as e:
        render(qwen7b, plan)
    assert e.value.field == field


def test_refuses_a_plan_the_card_cannot_run(qwen7b) -> None:
    # V100: compute capability 7.0, no bf16 (compat rule); an explicit bf16 is refused, not written
    explicit = TrainSetup(method="qlora", precision="bf16-mixed", sources={"precision": "flag"})
    with pytest.raises(TuneplanError, match="cannot run"):
        build_export("llamafactory", estimate(qwen7b, explicit, gpu=_gpu("v100-32gb")), "x.yaml")


def test_precision_left_open_follows_the_card(qwen7b) -> None:
    b = build_export("llamafactory", estimate(qwen7b, TrainSetup(method="qlora"), gpu=_gpu("v100-32gb")),
                     "x.yaml")
    cfg = yaml.safe_load(b.files[0][1])
    assert cfg.get("fp16") is True and "bf16" not in cfg  # what the card supports


def _gpu(name: str):
    from tuneplan.catalog.accelerators import resolve_accelerator

    return resolve_accelerator(name)


@pytest.mark.parametrize("fmt", ["llamafactory", "hf-script"])
@pytest.mark.parametrize("field,value", [("activation_offload", True), ("loss", "chunked"),
                                         ("loss", "fused")])
def test_trainer_recipes_refuse_what_the_trainer_cannot_run(qwen7b, tmp_path: Path, fmt: str, field: str,
                                                            value: object) -> None:
    with pytest.raises(TuneplanError) as e:
        build_export(fmt, estimate(qwen7b, TrainSetup(method="lora", **{field: value})), tmp_path / "r")
    assert e.value.field == field


def test_liger_and_compile_are_written(qwen7b, tmp_path: Path) -> None:
    b = build_export("llamafactory",
                     estimate(qwen7b, TrainSetup(method="lora", loss="fused-linear", compile=True)),
                     tmp_path / "r")
    doc = yaml.safe_load(b.files[0][1])
    assert doc["enable_liger_kernel"] is True and doc["torch_compile"] is True
