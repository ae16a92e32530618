"""NCCL's per-call cost: latencies and the ring / tree choice, against hand sums of NCCL's tuning table
(src/graph/tuning.cc: baseLat Simple 8.4 us; hwLat Simple ring NVLink 3.4, PCIe 5.7, network 14; tree
NVLink 4.0, PCIe 4.0, network 14), and the calls an FSDP step makes."""

from __future__ import annotations

import pytest

from tuneplan.api import build_setup
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.nccl import collective_call, ring_latency_us, tree_latency_us
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.time_statics import RuntimeOptions, time_statics


def test_ring_latency_by_hand() -> None:
    # all-gather over 4 GPUs on PCIe: 3 steps -> 8.4 + 3 x 5.7
    assert ring_latency_us("all_gather", 4, 1, "pcie") == pytest.approx(25.5)
    # all-reduce over 8 GPUs on NVLink: 14 steps -> 8.4 + 14 x 3.4
    assert ring_latency_us("all_reduce", 8, 1, "nvlink") == pytest.approx(56.0)
    # 2 nodes x 8: 30 steps, 2 of them over the network -> 8.4 + 28 x 3.4 + 2 x 14
    assert ring_latency_us("all_reduce", 16, 2, "nvlink") == pytest.approx(131.6)


def test_tree_wins_small_buffers_across_nodes_ring_wins_large_ones() -> None:
    # tree: 8.4 + 2 x (7 x 4.0 + log2(2) x 14) = 92.4 us; bytes at 0.46 of the bus bandwidth
    assert tree_latency_us(16, 2, "nvlink") == pytest.approx(92.4)
    bus = 20.0  # GB/s
    small = collective_call("all_reduce", 1e6, 16, 2, "NVLink", bus)
    # ring: 131.6 us + 1e6 x 30/16 / 20e9 = 225.35 us; tree: 92.4 us + 1e6 / (20e9 x 0.46) = 201.1 us
    assert small.algorithm == "tree"
    assert small.seconds == pytest.approx(92.4e-6 + 1e6 / (20e9 * 0.46))
    large = collective_call("all_reduce", 1e9, 16, 2, "NVLink", bus)
    assert large.algorithm == "ring"
    assert large.seconds == pytest.approx(131.6e-6 + 1e9 * 30 / 16 / 20e9)
    # one node of 8 on PCIe: tree latency 8.4 + 2 x 7 x 4.0 = 64.4 us against the ring's 8.4 + 14 x 5.7 =
    # 88.2 us, but the ring's bytes are faster (14/8 < 1/0.46): the ring wins from
    # (88.2 - 64.4) us / (1/(0.46 x 20e9) - 1.75/20e9) = 1.12 MB on
    assert collective_call("all_reduce", 1.0e6, 8, 1, "PCIe 4.0 x16", bus).algorithm == "tree"
    assert collective_call("all_reduce", 1.2e6, 8, 1, "PCIe 4.0 x16", bus).algorithm == "ring"


def test_fsdp_step_pays_three_calls_per_unit() -> None:
    """Llama-2 7B (32 layers) LoRA under FSDP on 2 RTX 4090 (PCIe): 33 units x 3 calls x (8.4 + 5.7) us
    per micro-batch on top of the wrapper's volumes. The HF Trainer accumulates under ``no_sync``, so the
    gradients' reduce-scatter is the step's, the two gathers the micro-batch's; fsdp_qlora's loop has no
    ``no_sync`` and reduce-scatters every micro-batch."""
    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    acc = resolve_accelerator("rtx4090")
    for framework, reduce_per_micro in (("hf", False), ("fsdp-qlora", True)):
        run = resolve_run(spec, build_setup(spec, framework=framework, method="lora", gpus=2, fsdp=True,
                                            batch=1, seq=512))
        ts = time_statics(run, acc, RuntimeOptions())
        pp = run.param_plan
        gathered = pp.weight_bytes + pp.adapter_bytes
        wire = run.wrapper.gradient_wire_bytes(run) * pp.trainable_params
        rate = ts.link_gbs * 1e9
        gathers, reduce = 2 * gathered * 0.5 / rate, wire * 0.5 / rate  # ring factors (n-1)/n = 1/2
        volumes = gathers + (reduce if reduce_per_micro else 0.0)
        assert ts.per_micro - volumes == pytest.approx(33 * 3 * 14.1e-6, rel=1e-6)
        assert ts.per_step == pytest.approx(0.0 if reduce_per_micro else reduce, rel=1e-9, abs=1e-15)
