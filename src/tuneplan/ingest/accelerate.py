"""accelerate config YAML (what ``accelerate config`` writes) -> processes, machines, FSDP/DeepSpeed,
precision.

Key meanings from accelerate's ``commands/config/config_args.py`` (ClusterConfig): ``num_processes`` is
the total over all machines, ``num_machines`` the nodes; ``mixed_precision`` no|fp16|bf16|fp8;
``fsdp_config`` keys of ``FullyShardedDataParallelPlugin`` (``fsdp_sharding_strategy`` FULL_SHARD /
SHARD_GRAD_OP / NO_SHARD / HYBRID_SHARD or their numbers 1-4; ``fsdp_offload_params``;
``fsdp_version`` 2 with ``fsdp_reshard_after_forward``); ``deepspeed_config`` either names a DeepSpeed
JSON (``deepspeed_config_file``) or carries ``zero_stage``, ``offload_optimizer_device``,
``offload_param_device``, ``gradient_accumulation_steps`` itself.
"""

from __future__ import annotations

from typing import Any

from tuneplan.ingest.common import Collector, Ingested, map_plain
from tuneplan.ingest.document import Document

_IGNORED = frozenset({
    "compute_environment", "debug", "machine_rank", "main_process_ip", "main_process_port",
    "main_training_function",
    "rdzv_backend", "same_network", "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "tpu_name", "tpu_zone",
    "commands", "command_file", "downcast_bf16", "gpu_ids", "enable_cpu_affinity", "ipex_config",
    "mpirun_config",
    "deepspeed_multinode_launcher", "dynamo_config", "parallelism_config",
})
_NOT_MODELLED = {
    "megatron_lm_config": "Megatron-LM tensor/pipeline parallelism",
    "fp8_config": "fp8 training",
}
_SHARDING = {"1": "FULL_SHARD", "2": "SHARD_GRAD_OP", "3": "NO_SHARD", "4": "HYBRID_SHARD",
             "5": "_HYBRID_SHARD_ZERO2"}


def _fsdp(c: Collector, cfg: dict[str, Any]) -> None:
    k = "fsdp_config"
    strategy = cfg.get("fsdp_sharding_strategy")
    version = str(cfg.get("fsdp_version", 1))
    if version in ("1", "2"):
        c.set("fsdp_version", int(version), k, "fsdp_version")
    else:
        c.warn((k, "fsdp_version"), f"fsdp_version {version}: not 1 or 2, estimated as FSDP 1")
    if strategy is None and version == "2":
        reshard = cfg.get("fsdp_reshard_after_forward", True)
        strategy = "FULL_SHARD" if c.as_bool(reshard, (k, "fsdp_reshard_after_forward")) else "SHARD_GRAD_OP"
    strategy = _SHARDING.get(str(strategy), str(strategy or "FULL_SHARD")).upper()
    skey = (k, "fsdp_sharding_strategy") if "fsdp_sharding_strategy" in cfg else ("distributed_type",)
    if strategy == "NO_SHARD":
        c.set("fsdp", False, *skey)
        c.warn(skey, "NO_SHARD: a full replica per GPU, estimated as DDP")
    else:
        c.set("fsdp", True, *skey)
        if strategy != "FULL_SHARD":
            c.warn(skey, f"{strategy}: estimated as FULL_SHARD (parameters sharded too)")
    if cfg.get("fsdp_offload_params") is not None:
        on = c.as_bool(cfg["fsdp_offload_params"], (k, "fsdp_offload_params"))
        c.set("offload", "all" if on else "none", k, "fsdp_offload_params")
    if cfg.get("fsdp_activation_checkpointing") is not None:
        c.set("gradient_checkpointing", c.as_bool(cfg["fsdp_activation_checkpointing"],
                                                  (k, "fsdp_activation_checkpointing")),
              k, "fsdp_activation_checkpointing")


def _deepspeed(c: Collector, cfg: dict[str, Any]) -> None:
    k = "deepspeed_config"
    if cfg.get("deepspeed_config_file"):
        c.reference("deepspeed", str(cfg["deepspeed_config_file"]), k, "deepspeed_config_file")
        return
    stage = c.as_int(cfg.get("zero_stage", 0), (k, "zero_stage"), minimum=0)
    if stage > 3:
        raise c.fail((k, "zero_stage"), f"unknown ZeRO stage {stage}", accepted="0, 1, 2, 3")
    c.set("zero", stage, k, "zero_stage")
    opt = str(cfg.get("offload_optimizer_device") or "none").lower()
    par = str(cfg.get("offload_param_device") or "none").lower()
    for name, dev in (("offload_optimizer_device", opt), ("offload_param_device", par)):
        if dev not in ("none", "cpu", "nvme"):
            raise c.fail((k, name), f"unknown device {dev!r}", accepted="none, cpu, nvme")
    if par != "none" and stage == 3:
        c.set("offload", "all", k, "offload_param_device")
    elif opt != "none":
        c.set("offload", "optimizer", k, "offload_optimizer_device")
    else:
        c.set("offload", "none", k, "zero_stage")
    if cfg.get("gradient_accumulation_steps") not in (None, "auto"):
        c.set("grad_accum", c.as_int(cfg["gradient_accumulation_steps"], (k, "gradient_accumulation_steps")),
              k, "gradient_accumulation_steps")
    # accelerate's DeepSpeedPlugin builds the JSON from these with DeepSpeed's default buckets.
    c.out.extras["deepspeed"] = {"stage": stage, "buckets": {}, "overlap_comm": stage == 3,
                                 "offload_optimizer": None if opt == "none" else opt,
                                 "offload_param": None if par == "none" else par}


def read_accelerate(doc: Document) -> Ingested:
    c = Collector(doc, "accelerate", "accelerate yaml")
    d = doc.data
    dist = str(c.get("distributed_type", "NO")).upper()
    map_plain(c, "accelerate")
    machines = c.out.fields.get("nodes", 1)
    procs = c.as_int(c.get("num_processes", 1), "num_processes")
    if procs % machines:
        raise c.fail("num_processes", f"{procs} processes do not split evenly over {machines} machines "
                                      "(num_processes is the total over all machines)")
    if "num_processes" in d:
        c.set("gpus", procs // machines, "num_processes")
    if c.as_bool(c.get("use_cpu", False), "use_cpu"):
        c.warn("use_cpu", "a CPU run: GPU memory does not apply")
    mp = str(c.get("mixed_precision", "no")).lower()
    if mp in ("bf16", "fp16"):
        c.set("precision", f"{mp}-mixed", "mixed_precision")
    elif mp == "fp8":
        c.warn("mixed_precision", "fp8 training is not modelled; estimated with the other files / flags")
    elif mp != "no":
        raise c.fail("mixed_precision", f"unknown value {mp!r}", accepted="no, fp16, bf16, fp8")
    if dist == "FSDP":
        fc = c.get("fsdp_config", {})
        if not isinstance(fc, dict):
            raise c.fail("fsdp_config", f"expected a mapping, got {fc!r}")
        _fsdp(c, fc)
        c.set("zero", 0, "distributed_type")
    elif dist == "DEEPSPEED":
        dc = c.get("deepspeed_config", {})
        if not isinstance(dc, dict):
            raise c.fail("deepspeed_config", f"expected a mapping, got {dc!r}")
        _deepspeed(c, dc)
        c.set("fsdp", False, "distributed_type")
    elif dist in ("NO", "MULTI_GPU", "MULTI_NPU", "MULTI_XPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA",
                  "MULTI_HPU"):
        c.set("zero", 0, "distributed_type")
        c.set("fsdp", False, "distributed_type")
        c.set("offload", "none", "distributed_type")
    elif dist == "MEGATRON_LM":
        c.warn("distributed_type", "Megatron-LM parallelism is not modelled; estimated as data parallel")
    else:
        raise c.fail("distributed_type", f"unknown value {dist!r}",
                     accepted="NO, MULTI_GPU, FSDP, DEEPSPEED, MEGATRON_LM")
    c.handled.update({"fsdp_config", "deepspeed_config"})
    return c.finish(_IGNORED, (), _NOT_MODELLED, "not an accelerate config key tuneplan knows; not modelled")
