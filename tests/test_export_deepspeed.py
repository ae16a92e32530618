"""DeepSpeed JSON export: the stage, offload and buckets the estimate assumed, in DeepSpeed's key names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneplan.api import estimate
from tuneplan.errors import TuneplanError
from tuneplan.export import build_export
from tuneplan.export.deepspeed_json import deepspeed_config
from tuneplan.specs.setup import TrainSetup

SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "recorded" / "deepspeed_schema.json").read_text())

PLANS = [
    dict(method="lora", batch=4, seq=2048, grad_accum=2, gpus=4, zero=3),
    dict(method="full", batch=1, seq=1024, gpus=8, zero=3, offload="all", optimizer="adamw"),
    dict(method="full", batch=2, seq=512, gpus=2, zero=2, offload="optimizer", precision="fp16-mixed",
         optimizer="adamw-fused"),
    dict(method="qlora", batch=1, seq=512, gpus=2, nodes=2, zero=1),
    dict(method="full", batch=1, seq=512, zero=3, offload="all", optimizer="adamw"),  # one GPU + offload
]


def render(model, plan: dict) -> dict:
    b = build_export("deepspeed", estimate(model, TrainSetup(**plan)), "ds.json")
    return json.loads(b.files[0][1])


@pytest.mark.parametrize("plan", PLANS)
def test_keys_are_deepspeed_keys(qwen7b, plan) -> None:
    cfg = render(qwen7b, plan)
    top = set(SCHEMA["top_level"])
    assert set(cfg) <= top, set(cfg) - top
    assert set(cfg["zero_optimization"]) <= set(SCHEMA["zero_optimization"])
    for section in ("offload_optimizer", "offload_param"):
        if section in cfg["zero_optimization"]:
            assert set(cfg["zero_optimization"][section]) <= set(SCHEMA[section])
            assert cfg["zero_optimization"][section]["device"] in SCHEMA["offload_devices"]
    for section in ("bf16", "fp16"):
        if section in cfg:
            assert set(cfg[section]) <= set(SCHEMA[section])


@pytest.mark.parametrize("plan", PLANS)
def test_values_are_the_plan(qwen7b, plan) -> None:
    cfg = render(qwen7b, plan)
    world = plan.get("gpus", 1) * plan.get("nodes", 1)
    assert cfg["train_micro_batch_size_per_gpu"] == plan["batch"]
    assert cfg["gradient_accumulation_steps"] == plan.get("grad_accum", 1)
    assert cfg["train_batch_size"] == plan["batch"] * plan.get("grad_accum", 1) * world
    zo = cfg["zero_optimization"]
    assert zo["stage"] == plan["zero"]
    # DeepSpeed's defaults (deepspeed/runtime/zero/config.py), which the estimator assumes
    assert zo["reduce_bucket_size"] == 500_000_000
    assert zo["overlap_comm"] is False
    if plan["zero"] == 3:
        assert zo["stage3_prefetch_bucket_size"] == 50_000_000
    offload = plan.get("offload", "none")
    assert ("offload_optimizer" in zo) == (offload in ("optimizer", "all"))
    assert ("offload_param" in zo) == (offload == "all")
    prec = plan.get("precision", "bf16-mixed")
    assert cfg.get("bf16", {}).get("enabled", False) == prec.startswith("bf16")
    assert cfg.get("fp16", {}).get("enabled", False) == prec.startswith("fp16")


def test_buckets_come_from_the_estimator() -> None:
    from tuneplan.estimator.wrappers.zero_terms import DS_PREFETCH_BUCKET, DS_REDUCE_BUCKET
    from tuneplan.specs.model import model_from_config

    from .conftest import TINY_LLAMA

    cfg = deepspeed_config(model_from_config(TINY_LLAMA), TrainSetup(zero=3, gpus=2, optimizer="adamw"))
    assert cfg["zero_optimization"]["reduce_bucket_size"] == DS_REDUCE_BUCKET
    assert cfg["zero_optimization"]["stage3_prefetch_bucket_size"] == DS_PREFETCH_BUCKET


def test_overlap_comm_is_the_setups() -> None:
    from tuneplan.specs.model import model_from_config

    from .conftest import TINY_LLAMA

    spec = model_from_config(TINY_LLAMA)
    on = deepspeed_config(spec, TrainSetup(zero=2, gpus=2, optimizer="adamw", ds_overlap_comm=True))
    off = deepspeed_config(spec, TrainSetup(zero=2, gpus=2, optimizer="adamw"))
    assert (on["zero_optimization"]["overlap_comm"] is True
            and off["zero_optimization"]["overlap_comm"] is False)


@pytest.mark.parametrize("plan,field", [
    (dict(fsdp=True, gpus=2), "format"),
    (dict(gpus=2), "zero"),
    (dict(zero=2, gpus=2, offload="optimizer", optimizer="adamw-8bit"), "optimizer"),
])
def test_refusals(qwen7b, plan, field) -> None:
    with pytest.raises(TuneplanError) as e:
        build_export("deepspeed", estimate(qwen7b, TrainSetup(**plan)), "ds.json")
    assert e.value.field == field


@pytest.mark.parametrize("plan", PLANS)
def test_deepspeed_accepts_it(qwen7b, plan) -> None:
    """Where DeepSpeed is importable, its own pydantic models (which forbid unknown keys) validate."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install -e '.[deepspeed]')")
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    cfg = render(qwen7b, plan)
    z = DeepSpeedZeroConfig(**cfg["zero_optimization"])
    assert int(z.stage) == plan["zero"]
    assert z.reduce_bucket_size == 500_000_000
    if "bf16" in cfg:
        DeepSpeedBF16Config(**cfg["bf16"])
    if "fp16" in cfg:
        DeepSpeedFP16Config(**cfg["fp16"])
