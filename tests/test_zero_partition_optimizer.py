"""The Trainer's optimizer under DeepSpeed ZeRO-1/2 (estimator/wrappers/zero.py, simulate/zero.py): DeepSpeed
hands it this rank's fp32 master partition, one flat fp32 tensor of T/N elements with an fp32 gradient
(stage_1_and_2.py: each group's params become ``[single_partition_of_fp32_groups[i]]``), and frees the
16-bit gradients before it steps. Expected bytes by hand from that layout and the optimizers' own code
(transformers Adafactor: a 1-D tensor keeps a full fp32 ``exp_avg_sq``; ``(grad**2) + eps`` two fp32
temporaries; bitsandbytes PagedAdamW: states in unified memory, outside the allocator)."""

from __future__ import annotations

import pytest

from tuneplan.api import build_setup
from tuneplan.estimator.memory import memory_breakdown
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.xp import ceil_div


def _zero(model, stage: int, optimizer: str, n: int = 4):
    setup = build_setup(model, method="full", precision="bf16-mixed", gpus=n, zero=stage, optimizer=optimizer)
    run = resolve_run(model, setup)
    return run, run.param_plan.trainable_params


@pytest.mark.parametrize("stage", [1, 2])
def test_adafactor_steps_the_fp32_partition(qwen7b, stage) -> None:
    run, t = _zero(qwen7b, stage, "adafactor")
    part = ceil_div(t, 4)
    b = memory_breakdown(qwen7b, run.setup)
    # fp32 master partition (4 B) + Adafactor's unfactored second moment of a 1-D tensor (4 B)
    assert b.components["optimizer_states"] == ceil_div(4 * t, 4) + 4 * part
    wm = memory_statics(run).wrapped
    # the fp32 gradient partition, then grad**2 and + eps
    assert wm.resident.optimizer_temp == 4 * part + 2 * 4 * part
    assert wm.step_gradients == 0


def test_paged_states_leave_only_the_master_on_the_device(qwen7b) -> None:
    run, t = _zero(qwen7b, 2, "paged-adamw")
    b = memory_breakdown(qwen7b, run.setup)
    assert b.components["optimizer_states"] == ceil_div(4 * t, 4)
    # PagedAdamW's two fp32 states of the flat partition this rank steps, in unified memory
    assert b.paged_bytes == 2 * 4 * ceil_div(t, 4)


def test_offload_steps_cpu_adam_with_nothing_paged(qwen7b) -> None:
    # with offload_optimizer DeepSpeed steps its CPU Adam, whatever the Trainer's ``optim``
    setup = build_setup(qwen7b, method="full", precision="bf16-mixed", gpus=4, zero=2,
                        optimizer="paged-adamw", offload="optimizer")
    assert memory_breakdown(qwen7b, setup).paged_bytes == 0


def test_adamw_foreach_adds_its_sqrt_temporary_on_the_partition(qwen7b) -> None:
    setup = build_setup(qwen7b, method="lora", precision="bf16-mixed", gpus=4, zero=1, optimizer="adamw")
    run = resolve_run(qwen7b, setup)
    t = run.param_plan.trainable_params
    part = ceil_div(t, 4)
    wm = memory_statics(run).wrapped
    assert wm.resident.states == ceil_div(4 * t, 4) + 2 * 4 * part
    # the step's two instants are equal here: the slice's 16-bit gradients, their flattened copy and the
    # fp32 gradient partition (2 + 2 + 4 B), or that partition and _foreach_sqrt's temporary (4 + 4 B)
    assert wm.step_gradients is not None
    assert wm.step_gradients + wm.resident.optimizer_temp == 8 * part


def test_sgd_step_peaks_as_the_gradients_are_flattened(qwen7b) -> None:
    # SGD without momentum has no temporary: the larger instant is before it, the slice's 16-bit gradients
    # (LoRA: its first adapters are small, the slice itself), their flattened copy and the fp32 partition
    setup = build_setup(qwen7b, method="lora", precision="bf16-mixed", gpus=4, zero=2, optimizer="sgd")
    run = resolve_run(qwen7b, setup)
    part = ceil_div(run.param_plan.trainable_params, 4)
    wm = memory_statics(run).wrapped
    assert (wm.step_gradients, wm.resident.optimizer_temp) == (2 * part, 2 * part + 4 * part)


@pytest.mark.parametrize("stage", [1, 2])
def test_fp32_zero12_still_clones_the_master(qwen7b, stage) -> None:
    # stage_1_and_2.py: the fp32 master is ``partition.detach().clone().to(fp32)``, a copy in fp32 runs too
    setup = build_setup(qwen7b, method="full", precision="fp32", gpus=4, zero=stage, optimizer="adamw-fused")
    run = resolve_run(qwen7b, setup)
    t = run.param_plan.trainable_params
    part = ceil_div(t, 4)
    wm = memory_statics(run).wrapped
    assert wm.resident.states == ceil_div(4 * t, 4) + 8 * part + 512
    assert wm.resident.optimizer_temp == 4 * part  # flatten(averaged_gradients): a new fp32 partition
