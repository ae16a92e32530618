"""The wrappers' table (estimator/wrappers): which wrapper a setup resolves to, and the DDP replica's terms
counted by hand (torch DistributedDataParallel with gradient_as_bucket_view=False: buckets the size of the
gradients, NCCL's buffers outside the allocator)."""

from __future__ import annotations

import pytest

from tuneplan.api import build_setup
from tuneplan.estimator.optimizer import OptimizerPlan
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers import WRAPPERS, wrapper_for

CASES = [
    (dict(), "ddp"),
    (dict(gpus=2), "ddp"),
    (dict(gpus=2, fsdp=True), "fsdp1"),
    (dict(gpus=2, fsdp=True, fsdp_version=2), "fsdp2"),
    (dict(gpus=2, zero=1), "zero-1"),
    (dict(gpus=2, zero=2), "zero-2"),
    (dict(gpus=4, zero=3), "zero-3"),
    (dict(gpus=4, zero=3, offload="optimizer"), "zero-3"),
]


@pytest.mark.parametrize(("fields", "name"), CASES)
def test_one_row_applies_and_the_run_keeps_it(qwen7b, fields, name) -> None:
    setup = build_setup(qwen7b, method="lora", precision="bf16-mixed", **fields)
    assert [w.name for w in WRAPPERS if w.applies(setup)][:1] == [name]
    assert wrapper_for(setup).name == name
    run = resolve_run(qwen7b, setup)
    assert run.wrapper.name == name
    # chosen once: reshaping the run keeps the same wrapper
    assert run.reshaped(batch=3, grad_accum=2).wrapper is run.wrapper


def test_names_are_unique() -> None:
    names = [w.name for w in WRAPPERS]
    assert len(set(names)) == len(names)


def test_ddp_replica_by_hand(qwen7b) -> None:
    # Qwen2.5-7B LoRA (the default targets, as the run resolves them), bf16 mixed:
    # the adapters train in fp32, 4 B per gradient element; DDP buckets hold as many bytes again
    setup = build_setup(qwen7b, method="lora", precision="bf16-mixed", gpus=2)
    run = resolve_run(qwen7b, setup)
    grads = run.param_plan.trainable_params * 4
    assert run.param_plan.trainable_bytes == 4
    wm = run.wrapper.memory(run, OptimizerPlan(states=123, paged=0, temp=45))
    assert wm.resident.gradients == grads
    assert wm.buckets.persistent == grads
    assert wm.resident.nccl == 512 * 1024**2
    assert (wm.resident.states, wm.resident.optimizer_temp, wm.resident.host) == (123, 45, 0)
    assert wm.gathered.in_layers == wm.gathered.at_loss == 0
    one = resolve_run(qwen7b, build_setup(qwen7b, method="lora", precision="bf16-mixed"))
    single = one.wrapper.memory(one, OptimizerPlan(0, 0, 0))
    assert single.buckets.persistent == 0 and single.resident.nccl == 0


def test_no_collectives_on_one_gpu(qwen7b) -> None:
    from tuneplan.estimator.links import Link

    run = resolve_run(qwen7b, build_setup(qwen7b, method="lora", precision="bf16-mixed"))
    link = Link("test link", 100.0, "a test")
    c = run.wrapper.collectives(run, grad_bytes=2, gathered_bytes=10**9, link=link)
    assert (c.per_micro_batch, c.per_step, c.serial) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(("bucket", "elements"), [(None, 500_000_000), (100_000_000, 100_000_000)])
def test_memory_and_time_read_the_same_reduce_bucket(qwen7b, bucket, elements) -> None:
    # DeepSpeed's reduce_bucket_size (default 5e8 elements, deepspeed/runtime/zero/config.py): ZeRO-2's IPG
    # bucket in the 16-bit dtype while the layers are back-propagated, and the last reduction the backward
    # cannot hide
    setup = build_setup(qwen7b, method="full", precision="bf16", gpus=2, zero=2, ds_reduce_bucket=bucket)
    run = resolve_run(qwen7b, setup)
    assert run.wrapper.memory(run, OptimizerPlan(0, 0, 0)).buckets.in_layers == elements * 2
    assert run.wrapper.last_bucket_bytes(run, run.wrapper.gradient_wire_bytes(run)) == elements * 2


@pytest.mark.parametrize("fields", [dict(), dict(gpus=2, fsdp=True), dict(gpus=4, zero=3)])
def test_the_breakdowns_upper_band_is_the_grids(qwen7b, fields) -> None:
    # the upper band read off one breakdown's bands (MemoryBreakdown.device_peak_high_bytes) and the one a
    # grid computes from its arrays (overhead.device_peak_high) agree, and lie above the central figures
    from tuneplan.api import estimate_run
    from tuneplan.estimator.overhead import device_peak_high

    run = resolve_run(qwen7b, build_setup(qwen7b, method="lora", precision="bf16-mixed", seq=1024, **fields))
    b = estimate_run(run).breakdown
    high = device_peak_high(b.allocated_peak_bytes, b.reserved_peak_bytes, b.device_peak_bytes)
    assert b.device_peak_high_bytes == high
    assert b.device_peak_high_bytes > b.device_peak_bytes
    assert b.reserved_high_bytes > b.reserved_peak_bytes and b.allocated_high_bytes > b.allocated_peak_bytes
