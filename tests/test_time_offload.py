"""ZeRO-Offload's step against the plain step: what offload adds (the host copies, the CPU update, the
gradients' round trips through the host buffer they accumulate in) and what DeepSpeed's bf16 engine
removes (PEFT's fp32 adapters cast to bf16, so their element-wise traffic halves)."""

from __future__ import annotations

import pytest

from tuneplan.api import estimate
from tuneplan.estimator.compute import flops_at
from tuneplan.estimator.links import host_link
from tuneplan.estimator.time_statics import RuntimeOptions, time_statics

MODEL = "meta-llama/Llama-2-7b-hf"
SHAPE = {"method": "lora", "batch": 2, "seq": 2048}
OFFLOAD = {"zero": 2, "offload": "optimizer"}
# LoRA r = 16 on q_proj and v_proj (the hf profile's default targets) of Llama-2 7B: 32 layers x 2 modules
# x r x (d_in + d_out) = 32 x 2 x 16 x (4096 + 4096)
TRAINABLE = 32 * 2 * 16 * (4096 + 4096)
# DeepSpeed ZeRO-Offload's CPU Adam, as the model states it: 30 B of host memory traffic per parameter at
# 20 GB/s per GPU (estimator/time_statics.py, HOST_ADAM_BYTES_PER_PARAM / HOST_MEMORY_GBS_PER_GPU)
CPU_ADAM_S = TRAINABLE * 30 / 20e9


def _time(gpu: str = "rtx4090", **kw: object) -> dict:
    return estimate(MODEL, gpu=gpu, **{**SHAPE, **kw}).extras["sections"]["time"]


def _host_bps(gpu: str) -> float:
    from tuneplan.catalog.accelerators import resolve_accelerator

    return host_link(resolve_accelerator(gpu)).gbs * 1e9


def _stream_bps(**kw: object) -> float:
    """The element-wise kernels' bandwidth on the card (its memory bandwidth at the streaming fraction)."""
    e = estimate(MODEL, gpu="rtx4090", timing=False, **{**SHAPE, **kw})
    return time_statics(e.run, e.gpu, RuntimeOptions()).bw


@pytest.mark.parametrize("ga", [1, 2, 4])
def test_zero2_offload_accumulates_through_the_host_every_micro_batch(ga: int) -> None:
    """stage_1_and_2.py: with the optimizer on the CPU and more than one micro-batch per step, every
    micro-batch's gradient hook brings the bf16 host buffer up, adds, and sends the sum down
    (``async_accumulate_grad_in_cpu_via_gpu``): 2 x 2 B per trainable parameter per micro-batch, on top of
    the step's fp32 gradients down and bf16 weights up (4 + 2 B per parameter) and the CPU update."""
    host = _host_bps("rtx4090")
    trips = ga if ga > 1 else 0
    expected = (TRAINABLE * (4 + 2) + trips * 2 * TRAINABLE * 2) / host + CPU_ADAM_S
    assert _time(grad_accum=ga, **OFFLOAD)["components_seconds"]["offload"] == pytest.approx(expected)


def test_zero1_offload_makes_the_trip_once_per_step() -> None:
    """ZeRO-1 reduces only at the accumulation boundary, where the same buffer is used once: one round trip
    of this rank's half of the adapters per step on two cards."""
    host = _host_bps("rtx4090")
    one, four = (_time(gpus=2, zero=1, offload="optimizer", grad_accum=ga)["components_seconds"]["offload"]
                 for ga in (1, 4))
    assert four - one == pytest.approx(2 * (TRAINABLE / 2) * 2 / host)


@pytest.mark.parametrize(("kw", "per_micro", "per_step", "per_trip"), [
    # one card, optimizer offloaded: bf16 gradients into the bucket each micro-batch (2 + 2 B), then once
    # per step the cast to fp32 on the GPU (read 2 B, write 4 B) before they go down; accumulating, each
    # micro-batch adds the buffer that came up to the new gradient (read 2 + 2 B, write 2 B)
    (OFFLOAD, 2 * TRAINABLE * 2, TRAINABLE * (2 + 4), TRAINABLE * 3 * 2),
    # two cards, nothing offloaded: the bucket, then this rank's half into the partition buffer (2 + 2 B)
    ({"gpus": 2, "zero": 2}, 2 * TRAINABLE * 2 + 2 * TRAINABLE / 2 * 2, 0, 0),
    # ZeRO-1 reduces once, at the last micro-batch
    ({"gpus": 2, "zero": 1}, 0, 2 * TRAINABLE * 2 + 2 * TRAINABLE / 2 * 2, 0),
])
def test_zero_gradient_copies_on_the_gpu(kw: dict, per_micro: float, per_step: float,
                                         per_trip: float) -> None:
    """stage_1_and_2.py with contiguous gradients (DeepSpeed's default): the copy of every gradient into
    the reduction bucket and of this rank's shard out of it, in bf16 (the engine's cast)."""
    bw = _stream_bps(**kw)
    for ga in (1, 4):
        got = _time(grad_accum=ga, **kw)["components_seconds"]["gradient_copies"]
        trips = ga if ga > 1 else 0
        assert got == pytest.approx((ga * per_micro + per_step + trips * per_trip) / bw)


@pytest.mark.parametrize("ga", [1, 4])
def test_offload_never_shortens_a_step_of_the_same_dtypes(ga: int) -> None:
    """In fp32 DeepSpeed casts nothing, so the GPU work is the plain run's: the offloaded step is the plain
    step less its GPU update plus the host copies and the CPU update, never shorter."""
    plain = _time(precision="fp32", grad_accum=ga)
    off = _time(precision="fp32", grad_accum=ga, **OFFLOAD)
    for part in ("matmul", "elementwise", "launch_and_fixed"):
        assert off["components_seconds"][part] == pytest.approx(plain["components_seconds"][part])
    host = _host_bps("rtx4090")
    trips = ga if ga > 1 else 0
    copies = (TRAINABLE * (4 + 4) + trips * 2 * TRAINABLE * 4) / host + CPU_ADAM_S
    # every micro-batch's fp32 gradients into the bucket (read + write), and accumulating the add of the
    # buffer that came up (read 2, write 1); no cast to fp32 before they go down
    copies += (ga * 2 * TRAINABLE * 4 + trips * 3 * TRAINABLE * 4) / _stream_bps(precision="fp32")
    gpu_update = plain["components_seconds"]["optimizer"]
    assert off["step_seconds"] == pytest.approx(plain["step_seconds"] - gpu_update + copies)
    assert off["step_seconds"] > plain["step_seconds"]


def test_the_bf16_gap_is_deepspeeds_cast_of_the_adapters() -> None:
    """bf16-mixed: the plain run keeps PEFT's fp32 adapters under autocast, DeepSpeed's engine casts every
    floating parameter to bf16 (engine.py ``_configure_distributed_model``). Every adapter tensor then
    moves half the bytes and nothing else changes: the offloaded step is shorter than the plain one by
    exactly that half of the adapters' element-wise traffic, less what offload costs."""
    runs = [estimate(MODEL, gpu="rtx4090", timing=False, **SHAPE, **z) for z in ({}, OFFLOAD)]
    assert [r.run.dtypes.adapter for r in runs] == [4, 2]
    ts = [time_statics(r.run, r.gpu, RuntimeOptions()) for r in runs]
    parts = [flops_at(t.flops, SHAPE["seq"]).traffic_parts for t in ts]
    assert parts[1]["adapters"] == pytest.approx(parts[0]["adapters"] / 2)
    assert {k: v for k, v in parts[1].items() if k != "adapters"} == pytest.approx(
        {k: v for k, v in parts[0].items() if k != "adapters"})
    tokens = SHAPE["batch"] * SHAPE["seq"]
    saving = parts[0]["adapters"] / 2 * tokens / ts[0].bw
    plain, off = _time(), _time(**OFFLOAD)
    copies = TRAINABLE * (4 + 2) / _host_bps("rtx4090") + CPU_ADAM_S
    copies += (2 * TRAINABLE * 2 + TRAINABLE * (2 + 4)) / ts[1].bw  # the bucket copy, the cast to fp32
    gpu_update = plain["components_seconds"]["optimizer"]
    assert off["step_seconds"] == pytest.approx(plain["step_seconds"] - saving - gpu_update + copies)
    assert off["step_seconds"] + saving > plain["step_seconds"]
