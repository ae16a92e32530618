"""The rows of how the job spreads over GPUs: data parallelism, ZeRO / FSDP, offload, a split model, and
the DeepSpeed details a config carries (no flag: read from and written to DeepSpeed JSON)."""

from __future__ import annotations

from tuneplan.specs.fields.field import Field, row
from tuneplan.specs.setup import DEVICE_MAPS, OFFLOADS

ROWS: tuple[Field, ...] = (
    row(
        "gpus",
        int,
        1,
        "GPUs per node (default: 1)",
        accepted=">= 1",
        flag=("--gpus",),
        label="GPUs per node",
        widget="number",
        via={"accelerate": ("num_processes",)},  # the total over all machines
    ),
    row(
        "nodes",
        int,
        1,
        "nodes (default: 1)",
        accepted=">= 1",
        flag=("--nodes",),
        label="Nodes",
        widget="number",
        keys={"accelerate": ("num_machines",)},
    ),
    row(
        "zero",
        int,
        0,
        "DeepSpeed ZeRO stage (default: 0)",
        accepted=(0, 1, 2, 3),
        flag=("--zero",),
        label="DeepSpeed ZeRO stage",
        widget="dropdown",
        via={
            "deepspeed": ("zero_optimization", "stage"),
            "accelerate": ("distributed_type", "deepspeed_config", "zero_stage"),
        },
    ),
    row(
        "fsdp",
        bool,
        False,
        "PyTorch FSDP full shard",
        flag=("--fsdp/--no-fsdp",),
        label="FSDP full shard",
        widget="checkbox",
        via={
            "axolotl": ("fsdp", "fsdp_config"),
            "transformers": ("fsdp",),
            "accelerate": ("distributed_type", "fsdp_config"),
        },
    ),
    row(
        "fsdp_version",
        int,
        1,
        "FSDP 1 (FullyShardedDataParallel) or 2 (fully_shard) (default: 1)",
        accepted=(1, 2),
        flag=("--fsdp-version",),
        via={"accelerate": ("fsdp_config",)},
    ),
    row(
        "offload",
        str,
        "none",
        "CPU offload of ZeRO / FSDP states (default: none)",
        accepted=OFFLOADS,
        flag=("--offload",),
        label="CPU offload",
        widget="dropdown",
        via={
            "axolotl": ("fsdp", "fsdp_config"),
            "transformers": ("fsdp",),
            "deepspeed": ("zero_optimization",),
            "accelerate": ("distributed_type", "deepspeed_config", "fsdp_config"),
        },
    ),
    row(
        "device_map",
        str,
        "none",
        "split the layers over the GPUs of one process, one card busy at a time (transformers "
        "from_pretrained device_map); none: one data-parallel process per GPU (default: none)",
        accepted=DEVICE_MAPS,
        flag=("--device-map",),
        label="Layers split over the GPUs (device_map)",
        widget="dropdown",
    ),
    row(
        "ds_reduce_bucket",
        int,
        None,
        "DeepSpeed reduce bucket (default: DeepSpeed's)",
        unit="elements",
        via={"deepspeed": ("zero_optimization", "reduce_bucket_size")},  # "auto" = hidden^2
    ),
    row(
        "ds_prefetch_bucket",
        int,
        None,
        "DeepSpeed ZeRO-3 prefetch bucket (default: DeepSpeed's)",
        unit="elements",
        via={"deepspeed": ("zero_optimization", "stage3_prefetch_bucket_size")},  # "auto" = 0.9 hidden^2
    ),
    row(
        "ds_overlap_comm",
        bool,
        None,
        "DeepSpeed overlap_comm (default: on for ZeRO-3 only)",
        via={"deepspeed": ("zero_optimization", "overlap_comm")},  # counted for ZeRO-1/2 only
    ),
)
