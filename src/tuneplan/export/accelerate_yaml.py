"""accelerate config YAML (``accelerate launch --config_file F``) for the plan's GPUs and sharding.

Keys as ``accelerate config`` writes them (accelerate commands/config/config_args.py ClusterConfig;
FSDP keys of ``FullyShardedDataParallelPlugin``). DeepSpeed plans point at a DeepSpeed JSON written
beside this file (``deepspeed_config_file``), because accelerate's inline DeepSpeed keys cannot set the
bucket sizes the estimate assumed. FSDP plans: FULL_SHARD, transformer-block wrapping (accelerate takes
the block class from the model's ``_no_split_modules``), ``use_orig_params`` so frozen and trainable
(LoRA) parameters can share a unit, and the activation checkpointing of the plan (the Trainer refuses
``gradient_checkpointing`` together with FSDP's own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from tuneplan.errors import TuneplanError
from tuneplan.export.common import header_lines, plain_keys
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.api import Estimate

# accelerate mixed_precision per plan precision: pure 16-bit and fp32 runs load the weights in their dtype
# and need no autocast policy ("no"); '-mixed' ones ask accelerate for autocast / an FSDP MixedPrecision.
MIXED_PRECISION = {"bf16-mixed": "bf16", "fp16-mixed": "fp16", "bf16": "no", "fp16": "no", "fp32": "no"}


def accelerate_config(model: ModelSpec, setup: TrainSetup, acc: Accelerator | None = None,
                      deepspeed_file: str = "ds_config.json") -> dict[str, Any]:
    s = setup
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    if s.zero:
        cfg["distributed_type"] = "DEEPSPEED"
        ds: dict[str, Any] = {"deepspeed_config_file": deepspeed_file, "zero3_init_flag": s.zero == 3}
        if s.nodes > 1:
            ds["deepspeed_multinode_launcher"] = "standard"
        cfg["deepspeed_config"] = ds
        # DeepSpeed reads precision from its JSON; accelerate must agree with it.
        cfg["mixed_precision"] = "bf16" if s.precision.startswith("bf16") else (
            "fp16" if s.precision.startswith("fp16") else "no")
    elif s.fsdp:
        if s.offload == "optimizer":
            raise TuneplanError("FSDP has no optimizer-only offload (CPUOffload moves parameters and "
                                "gradients, and the step runs on the CPU)", field="offload",
                                accepted="{offload=all} with {fsdp}, or {zero=2|3} {offload=optimizer}")
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {
            "fsdp_version": s.fsdp_version,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": s.offload == "all",
            "fsdp_state_dict_type": "FULL_STATE_DICT",
            "fsdp_activation_checkpointing": bool(s.gradient_checkpointing),
        }
        if s.fsdp_version == 2:
            # FSDP2 (accelerate's FSDP1-vs-FSDP2 guide): the sharding strategy becomes reshard_after_forward
            # (True = FULL_SHARD); prefetch, sync_module_states and use_orig_params are gone
            cfg["fsdp_config"]["fsdp_reshard_after_forward"] = True
        else:
            cfg["fsdp_config"].update({"fsdp_backward_prefetch": "BACKWARD_PRE",
                                       "fsdp_forward_prefetch": False,
                                       "fsdp_sharding_strategy": "FULL_SHARD",
                                       "fsdp_sync_module_states": True,
                                       "fsdp_use_orig_params": True})
        cfg["mixed_precision"] = MIXED_PRECISION[s.precision]
    else:
        cfg["distributed_type"] = "MULTI_GPU" if s.world_size > 1 else "NO"
        cfg["mixed_precision"] = MIXED_PRECISION[s.precision]
    cfg.update({
        "downcast_bf16": "no",
        "machine_rank": 0,
        "main_training_function": "main",
        **plain_keys(s, "accelerate"),  # num_machines
        "num_processes": s.world_size,  # the total over all machines
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    })
    if s.nodes > 1:
        cfg["main_process_ip"] = "MASTER_ADDR"  # set on each machine: the address of machine_rank 0
        cfg["main_process_port"] = 29500
    return cfg


def render_accelerate(est: Estimate, deepspeed_file: str = "ds_config.json") -> str:
    """The accelerate YAML for the plan ``est`` estimated (its model, setup and card)."""
    setup = est.setup
    cfg = accelerate_config(est.model, setup, est.gpu, deepspeed_file)
    head = [f"# {line}" for line in header_lines(est)]
    if setup.fsdp and setup.method == "qlora":  # FSDP flattens the 4-bit storage with the other parameters
        head.append("# QLoRA under FSDP: load with BitsAndBytesConfig(..., "
                    "bnb_4bit_quant_storage=<compute dtype>)")
    # accelerate's config has no device_map: the script's from_pretrained sets it
    if setup.device_map != "none":
        head.append(f"# device_map {setup.device_map}: one process; load the model with "
                    f"from_pretrained(..., device_map=\"{setup.device_map}\") in the training script")
    head.append("# Launch: accelerate launch --config_file THIS_FILE your_training_script.py ..."
                + (" (set machine_rank and main_process_ip on each machine)" if setup.nodes > 1 else ""))
    return "\n".join(head) + "\n" + yaml.safe_dump(cfg, sort_keys=False)
