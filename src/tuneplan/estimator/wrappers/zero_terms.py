"""What every DeepSpeed ZeRO stage shares before partitioning: the 16-bit module, the fp32 master and the
optimizer's states as DeepSpeed hands them to the optimizer, the reduce and prefetch buckets (DeepSpeed 0.19.8
stage_1_and_2.py, stage3.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuneplan.estimator.optimizer import OptimizerPlan, optimizer_plan
from tuneplan.estimator.wrappers.zero3_step import zero3_step_temp
from tuneplan.estimator.xp import ceil_div
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run

DS_REDUCE_BUCKET = 500_000_000  # elements, DeepSpeed default reduce_bucket_size
DS_PREFETCH_BUCKET = 50_000_000  # elements, DeepSpeed default stage3_prefetch_bucket_size


@dataclass(frozen=True)
class DeepSpeedTerms:
    """What every stage shares, before partitioning the parameters and gradients."""

    weights16: int  # the module's parameters, trainable ones in 16 bits
    states: int  # this rank's fp32 master and optimizer states partition
    grads16: int  # every trainable parameter's 16-bit gradient
    reduce_bucket: int  # elements (setup.ds_reduce_bucket or DeepSpeed's default)
    prefetch_bucket: int  # elements (setup.ds_prefetch_bucket or DeepSpeed's default)
    bucket: int  # the contiguous-gradients IPG bucket, bytes
    fp32_grad_step: int  # the fp32 gradient partition the optimizer step reads
    step_temp: int  # the optimizer step's temporaries: that partition and the optimizer's own
    lazy_states: int = 0  # the optimizer's own states, made by its first step() (stage3.py 0.19.8)


def deepspeed_terms(run: Run, optimizer: OptimizerPlan) -> DeepSpeedTerms:
    """Trainable parameters live in 16 bits; the fp32 master and the optimizer's states are partitioned."""
    setup, params, compute = run.setup, run.param_plan, run.dtypes.compute
    world_size, trainable_params = setup.world_size, params.trainable_params
    weights16 = params.weight_bytes + params.adapter_bytes
    weights16 -= params.trainable_weight_params * max(params.trainable_bytes - compute, 0)
    if params.trainable_bytes > compute and trainable_params > params.trainable_weight_params:  # adapters too
        weights16 -= (trainable_params - params.trainable_weight_params) * (params.trainable_bytes - compute)
    # every stage clones the partition into the fp32 master (DeepSpeed 0.19.8 stage_1_and_2.py; stage3.py
    # _create_fp32_partitions, whose in-place branch compares a torch.device with a device-name str)
    master = 4 * trainable_params
    partition = ceil_div(trainable_params, world_size)
    client = partition_optimizer_plan(run, partition)
    reduce_bucket = reduce_bucket_elements(setup)
    # ZeRO-1/2 step(): ``flatten(averaged_gradients)`` then ``.to(fp32)``, a new fp32 partition in any dtype;
    # ZeRO-3: a copy only when gradients are 16-bit
    fp32_grad_step = 4 * partition if compute < 4 or setup.zero < 3 else 0
    # With contiguous_gradients (DeepSpeed's default) the IPG bucket is allocated at its full
    # reduce_bucket_size in the 16-bit dtype, however few parameters train (a LoRA run holds the same
    # 1 GB at the 5e8 default): stage_1_and_2.py setup_buckets() in every backward (a second one only
    # with overlap_comm, off by default below stage 3), stage3.py __init__ once. DeepSpeed 0.19 source.
    step_temp = fp32_grad_step + client.temp
    if setup.zero == 3:  # sub-group by sub-group, the flat 16-bit copy beside the fp32 one (zero3_step.py)
        step_temp = zero3_step_temp(run, partition, lambda elements: partition_optimizer_plan(run, elements))
    return DeepSpeedTerms(weights16=weights16, states=ceil_div(master, world_size) + client.states,
                          grads16=trainable_params * compute, reduce_bucket=reduce_bucket,
                          prefetch_bucket=setup.ds_prefetch_bucket or DS_PREFETCH_BUCKET,
                          bucket=reduce_bucket * compute, fp32_grad_step=fp32_grad_step,
                          step_temp=step_temp, lazy_states=client.states)


def partition_optimizer_plan(run: Run, partition: int) -> OptimizerPlan:
    """The optimizer as DeepSpeed hands it this rank's fp32 master partition: one flat fp32 tensor of
    ``partition`` elements with an fp32 gradient (stage_1_and_2.py sets each group's params to
    ``[single_partition_of_fp32_groups[i]]`` and its ``.grad`` to the fp32 ``single_grad_partition``;
    stage3.py steps ``fp32_partitioned_groups_flat``). Under the HF Trainer it is the Trainer's own optimizer
    (its ``optim``; transformers ``deepspeed_optim_sched`` with a config that names none); with
    ``offload_optimizer`` the config names AdamW and DeepSpeed steps its CPU Adam (fp32 states).

    Adafactor on an fp32 parameter and gradient makes no fp32 working copy of either (transformers
    ``Adafactor.step`` converts only 16-bit ones); ``update = (grad**2) + eps`` holds two partition-sized
    fp32 temporaries at once, the largest of its step."""
    name = "adamw-fused" if run.setup.offload in ("optimizer", "all") else run.optimizer
    plan = optimizer_plan(name, partition, 4, 1, partition, partition, tensor_sizes=((partition, 1),))
    if name == "adafactor":
        return OptimizerPlan(states=plan.states, paged=plan.paged, temp=2 * 4 * partition, notes=plan.notes)
    return plan


def reduce_bucket_elements(setup: TrainSetup) -> int:
    """DeepSpeed's ``reduce_bucket_size`` as the run sets it (a DeepSpeed JSON read by --from), or its
    default: the IPG bucket the memory model allocates and the last reduction the time model exposes."""
    return setup.ds_reduce_bucket or DS_REDUCE_BUCKET


def deepspeed_adapters(run: Run, weights: int) -> int:
    """The LoRA adapters among ``weights`` (this GPU's module parameters): in 16 bits when they train in
    fp32 (DeepSpeed keeps the module in the 16-bit dtype), partitioned under ZeRO-3."""
    setup, params, world_size = run.setup, run.param_plan, run.setup.world_size
    if params.trainable_bytes > run.dtypes.compute:
        return params.adapter_params * run.dtypes.compute // (world_size if setup.zero == 3 else 1)
    return (ceil_div(params.adapter_bytes, world_size) if setup.zero == 3
            else min(params.adapter_bytes, weights))
