"""ingest/accelerate.py: an ``accelerate config`` YAML read into GPUs, nodes, FSDP / DeepSpeed, precision."""

from __future__ import annotations

import pytest

from tuneplan.errors import ConfigError
from tuneplan.ingest.accelerate import read_accelerate
from tuneplan.ingest.document import Document


def read(data: dict):
    return read_accelerate(Document(path="acc.yaml", data=data, fmt="yaml"))


def test_num_processes_is_the_total_over_machines():
    # accelerate ClusterConfig: num_processes counts every process on every machine: 16 over 2 = 8 per node
    out = read({"distributed_type": "MULTI_GPU", "num_processes": 16, "num_machines": 2})
    assert (out.fields["gpus"], out.fields["nodes"]) == (8, 2)
    assert (out.fields["zero"], out.fields["fsdp"], out.fields["offload"]) == (0, False, "none")


def test_processes_must_split_over_machines():
    with pytest.raises(ConfigError) as err:
        read({"num_processes": 3, "num_machines": 2})
    assert err.value.field == "num_processes"


@pytest.mark.parametrize("mp, precision", [("bf16", "bf16-mixed"), ("fp16", "fp16-mixed"), ("no", None)])
def test_mixed_precision(mp, precision):
    assert read({"mixed_precision": mp}).fields.get("precision") == precision


def test_unknown_mixed_precision_is_refused():
    with pytest.raises(ConfigError) as err:
        read({"mixed_precision": "int4"})
    assert err.value.accepted == "no, fp16, bf16, fp8"


@pytest.mark.parametrize("strategy, fsdp", [("FULL_SHARD", True), (1, True), ("NO_SHARD", False), (3, False),
                                            ("SHARD_GRAD_OP", True), (2, True)])
def test_fsdp_sharding_strategy_names_and_numbers(strategy, fsdp):
    # FullyShardedDataParallelPlugin: 1 FULL_SHARD, 2 SHARD_GRAD_OP, 3 NO_SHARD, 4 HYBRID_SHARD
    out = read({"distributed_type": "FSDP", "fsdp_config": {"fsdp_sharding_strategy": strategy}})
    assert out.fields["fsdp"] is fsdp and out.fields["zero"] == 0
    assert bool(out.warnings) is (strategy not in ("FULL_SHARD", 1))


def test_fsdp2_reshard_after_forward():
    on = read({"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2}})
    assert on.fields["fsdp_version"] == 2 and on.fields["fsdp"] is True and not on.warnings
    off = read({"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2,
                                                            "fsdp_reshard_after_forward": False}})
    assert any("SHARD_GRAD_OP" in w for w in off.warnings)


def test_fsdp_offload_and_checkpointing():
    out = read({"distributed_type": "FSDP", "fsdp_config": {"fsdp_offload_params": True,
                                                            "fsdp_activation_checkpointing": "true"}})
    assert out.fields["offload"] == "all" and out.fields["gradient_checkpointing"] is True


def test_deepspeed_inline():
    out = read({"distributed_type": "DEEPSPEED", "num_processes": 4,
                "deepspeed_config": {"zero_stage": 2, "offload_optimizer_device": "cpu",
                                     "gradient_accumulation_steps": 8}})
    assert (out.fields["zero"], out.fields["offload"], out.fields["grad_accum"]) == (2, "optimizer", 8)
    assert out.fields["fsdp"] is False
    assert out.extras["deepspeed"]["overlap_comm"] is False  # DeepSpeed's default: on for stage 3 only


def test_deepspeed_param_offload_needs_stage_3():
    out = read({"distributed_type": "DEEPSPEED",
                "deepspeed_config": {"zero_stage": 3, "offload_param_device": "cpu",
                                     "offload_optimizer_device": "cpu"}})
    assert out.fields["offload"] == "all"
    stage2 = read({"distributed_type": "DEEPSPEED",
                   "deepspeed_config": {"zero_stage": 2, "offload_param_device": "cpu"}})
    assert stage2.fields["offload"] == "none"


def test_deepspeed_config_file_is_a_reference():
    out = read({"distributed_type": "DEEPSPEED", "deepspeed_config": {"deepspeed_config_file": "ds.json"}})
    assert out.references and out.references[0][:2] == ("deepspeed", "ds.json")
    assert "zero" not in out.fields


@pytest.mark.parametrize("data", [
    {"distributed_type": "TPU_POD"},
    {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 4}},
    {"distributed_type": "DEEPSPEED", "deepspeed_config": {"offload_optimizer_device": "disk"}},
    {"distributed_type": "FSDP", "fsdp_config": "full"},
])
def test_bad_values_are_refused(data):
    with pytest.raises(ConfigError):
        read(data)


def test_unknown_keys_warn_and_ignored_ones_do_not():
    out = read({"compute_environment": "LOCAL_MACHINE", "machine_rank": 0, "fp8_config": {"x": 1},
                "made_up": True})
    text = "\n".join(out.warnings)
    assert "fp8 training" in text and "made_up" in text and "machine_rank" not in text
