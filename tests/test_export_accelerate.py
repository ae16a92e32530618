"""accelerate config export: accelerate itself loads it (ClusterConfig refuses unknown keys)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuneplan.api import estimate
from tuneplan.errors import TuneplanError
from tuneplan.export import build_export
from tuneplan.specs.setup import TrainSetup

PLANS = [
    dict(method="lora", gpus=4, fsdp=True, offload="all"),
    dict(method="full", gpus=8, nodes=2, zero=3, offload="optimizer", optimizer="adamw"),
    dict(method="qlora", gpus=2),
    dict(method="lora"),
    dict(method="full", gpus=2, fsdp=True, precision="bf16"),
    dict(method="lora", gpus=2, fsdp=True, fsdp_version=2),
]


def write(model, plan: dict, folder: Path) -> tuple[Path, dict, TrainSetup]:
    b = build_export("accelerate", estimate(model, TrainSetup(**plan)), folder / "acc.yaml")
    for p, text in b.files:
        p.write_text(text)
    return b.files[0][0], yaml.safe_load(b.files[0][1]), b.setup


@pytest.mark.parametrize("plan", PLANS)
def test_accelerate_loads_it(qwen7b, plan, tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="accelerate comes with the simulate extra")
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser

    path, cfg, s = write(qwen7b, plan, tmp_path)
    cc = ClusterConfig.from_yaml_file(str(path))
    assert cc.num_processes == s.world_size and cc.num_machines == s.nodes
    # fsdp_config / deepspeed_config keys become `accelerate launch` options: each must be one
    options = {a.dest for a in launch_command_parser()._actions}
    for section in ("fsdp_config", "deepspeed_config"):
        assert set(cfg.get(section, {})) <= options, set(cfg.get(section, {})) - options


@pytest.mark.parametrize("plan", PLANS)
def test_values_are_the_plan(qwen7b, plan, tmp_path: Path) -> None:
    _, cfg, s = write(qwen7b, plan, tmp_path)
    kind = "DEEPSPEED" if s.zero else "FSDP" if s.fsdp else "MULTI_GPU" if s.world_size > 1 else "NO"
    assert cfg["distributed_type"] == kind
    assert cfg["num_processes"] == s.gpus * s.nodes  # accelerate: total over all machines
    if s.zero:
        ds = cfg["deepspeed_config"]
        assert ds["deepspeed_config_file"] == f"ds_z{s.zero}_config.json"
        assert (tmp_path / ds["deepspeed_config_file"]).exists()  # the companion is written beside
    if s.fsdp:
        f = cfg["fsdp_config"]
        assert f["fsdp_version"] == s.fsdp_version
        assert f["fsdp_offload_params"] == (s.offload == "all")
        if s.fsdp_version == 1:
            assert f["fsdp_sharding_strategy"] == "FULL_SHARD"
            assert f["fsdp_use_orig_params"] is True  # frozen + trainable parameters in one unit
        else:  # FSDP2 spells FULL_SHARD as resharding after forward and has no use_orig_params
            assert f["fsdp_reshard_after_forward"] is True
            assert "fsdp_sharding_strategy" not in f and "fsdp_use_orig_params" not in f
    mp = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(s.precision, "no")
    if s.zero and s.precision == "bf16":
        mp = "bf16"  # DeepSpeed reads bf16 from its JSON; accelerate must agree
    assert cfg["mixed_precision"] == mp


def test_fsdp_has_no_optimizer_only_offload(qwen7b) -> None:
    with pytest.raises(TuneplanError) as e:
        build_export("accelerate", estimate(qwen7b, TrainSetup(gpus=2, fsdp=True, offload="optimizer")),
                     "a.yaml")
    assert e.value.field == "offload"
