"""Step time, links, run time: properties that must hold, and quantities derived by hand."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuneplan.api import build_setup, estimate
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.errors import TuneplanError
from tuneplan.estimator.links import intra_node_link, ring_factor
from tuneplan.estimator.runtime import time_and_cost
from tuneplan.estimator.throughput import RuntimeOptions, UnknownThroughput, step_time
from tuneplan.specs.dataset import DatasetSpec
from tuneplan.specs.model import model_from_config

from .conftest import LLAMA2_7B, TINY_LLAMA

LLAMA = model_from_config(LLAMA2_7B, "llama-2-7b (hand config)")
TINY = model_from_config(TINY_LLAMA, "tiny")

setups = st.fixed_dictionaries({
    "method": st.sampled_from(["full", "lora", "qlora"]),
    "batch": st.sampled_from([1, 2, 8]),
    "seq": st.sampled_from([128, 512, 2048]),
    "grad_accum": st.sampled_from([1, 4]),
    "gradient_checkpointing": st.booleans(),
})
SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _step(model, acc, **kw):
    return step_time(model, build_setup(model, **kw), acc)


@SLOW
@given(setups)
def test_faster_card_is_never_slower(kw) -> None:
    a100 = resolve_accelerator("a100-80gb-sxm4")
    faster = dataclasses.replace(a100, bf16_tflops_dense=a100.bf16_tflops_dense * 1.5,
                                 memory_bandwidth_gbs=a100.memory_bandwidth_gbs * 1.5)
    assert _step(LLAMA, faster, **kw).step_seconds <= _step(LLAMA, a100, **kw).step_seconds


@SLOW
@given(setups)
def test_more_memory_bandwidth_alone_is_never_slower(kw) -> None:
    card = resolve_accelerator("rtx4090")
    wider = dataclasses.replace(card, memory_bandwidth_gbs=card.memory_bandwidth_gbs * 2)
    assert _step(LLAMA, wider, **kw).step_seconds <= _step(LLAMA, card, **kw).step_seconds


@SLOW
@given(setups, st.sampled_from([2, 4, 8]), st.sampled_from(["ddp", "zero1", "zero2", "zero3", "fsdp"]),
       st.sampled_from(["a100-80gb-sxm4", "rtx4090", "h100"]))
def test_more_gpus_never_raise_per_gpu_throughput(kw, gpus, par, card) -> None:
    acc = resolve_accelerator(card)
    one = _step(LLAMA, acc, **kw).tokens_per_second_per_gpu
    extra = {"ddp": {}, "zero1": {"zero": 1}, "zero2": {"zero": 2}, "zero3": {"zero": 3}, "fsdp": {"fsdp": True}}[par]
    many = _step(LLAMA, acc, gpus=gpus, **extra, **kw)
    assert many.tokens_per_second_per_gpu <= one * (1 + 1e-12)
    assert many.tokens_per_second == pytest.approx(many.tokens_per_second_per_gpu * gpus)


@SLOW
@given(setups)
def test_gradient_checkpointing_is_slower(kw) -> None:
    acc = resolve_accelerator("a100-80gb-sxm4")
    kw = dict(kw)
    kw.pop("gradient_checkpointing")
    on = _step(LLAMA, acc, gradient_checkpointing=True, **kw)
    off = _step(LLAMA, acc, gradient_checkpointing=False, **kw)
    assert on.step_seconds > off.step_seconds


def test_big_batches_are_compute_bound_tiny_ones_launch_bound() -> None:
    acc = resolve_accelerator("a100-80gb-sxm4")
    big = _step(LLAMA, acc, method="full", batch=8, seq=2048)
    tiny = _step(TINY, acc, method="lora", batch=1, seq=64)
    assert big.bound == "compute" and 0.3 < big.mfu < 0.8
    assert tiny.bound == "overhead"
    # launch-bound: doubling a tiny micro-batch costs (almost) nothing
    tiny2 = _step(TINY, acc, method="lora", batch=2, seq=64)
    assert tiny2.micro_batch_seconds == pytest.approx(tiny.micro_batch_seconds, rel=0.01)


def test_compute_bound_time_is_flops_over_achievable_peak() -> None:
    # Llama-2-7B full fine-tune, 8 x 2048 tokens on an A100: FLOPs x tokens / (312e12 x 0.8) is the matmul part
    acc = resolve_accelerator("a100-80gb-sxm4")
    s = build_setup(LLAMA, method="full", batch=8, seq=2048, gradient_checkpointing=False)
    st_ = step_time(LLAMA, s, acc)
    fl = st_.flops
    assert st_.components["matmul"] == pytest.approx(fl.total * 8 * 2048 / (312e12 * 0.8))
    assert st_.step_seconds > st_.components["matmul"]


def test_qlora_is_slower_than_lora_by_the_dequantization() -> None:
    acc = resolve_accelerator("rtx4090")
    lora = _step(LLAMA, acc, method="lora", batch=4, seq=512, gradient_checkpointing=True)
    qlora = _step(LLAMA, acc, method="qlora", batch=4, seq=512, gradient_checkpointing=True)
    assert qlora.components["dequant"] > 0 and lora.components["dequant"] == 0
    assert qlora.step_seconds > lora.step_seconds


def test_ddp_all_reduce_volume_by_hand() -> None:
    # LoRA on q,v of Llama-2-7B, r=16: 32 layers x 2 x 16 x (4096 + 4096) = 8,388,608 fp32 adapters (HF profile)
    acc = resolve_accelerator("a100-80gb-sxm4")
    st_ = _step(LLAMA, acc, method="lora", rank=16, targets="q_proj,v_proj", gpus=4, batch=4, seq=512)
    link = intra_node_link(acc, 4)
    volume = 8_388_608 * 4 * ring_factor("all_reduce", 4) / (link.gbs * 1e9)
    # 33.5 MB of gradients in DDP's 25 MiB buckets: 2 all-reduces, each a ring (its bytes beat a tree's at
    # 16.8 MB) paying NCCL's Simple-protocol latency 8.4 + 2 x (4 - 1) x 3.4 us on NVLink (tuning.cc)
    expected = volume + 2 * (8.4 + 6 * 3.4) * 1e-6
    assert st_.components["communication_total"] == pytest.approx(expected)
    assert 0 < st_.components["communication_exposed"] <= expected


def test_links_from_the_catalog_text() -> None:
    a100 = resolve_accelerator("a100-80gb-sxm4")  # "NVLink3 600 GB/s": 300 one way x 0.78
    assert intra_node_link(a100, 8).gbs == pytest.approx(300 * 0.78)
    pcie = resolve_accelerator("a100-80gb-pcie")  # bridge joins two cards only
    assert intra_node_link(pcie, 2).name == "NVLink bridge"
    assert intra_node_link(pcie, 4).name.startswith("PCIe 4.0")
    g4090 = resolve_accelerator("rtx4090")  # GeForce: no P2P, half of PCIe 4.0 x16 x 0.7
    assert intra_node_link(g4090, 2).gbs == pytest.approx(31.5 * 0.7 * 0.5)
    x8 = resolve_accelerator("rtx-4060-ti-16gb")  # "PCIe 4.0 x8 (!)"
    assert intra_node_link(x8, 2).gbs == pytest.approx(intra_node_link(g4090, 2).gbs / 2)
    assert ring_factor("all_reduce", 1) == 0 and ring_factor("all_gather", 4) == pytest.approx(0.75)


def test_slower_network_between_nodes_is_slower() -> None:
    acc = resolve_accelerator("h100")
    kw = dict(method="full", zero=3, gpus=8, nodes=2, batch=1, seq=1024)
    s = build_setup(LLAMA, **kw)
    fast = step_time(LLAMA, s, acc, RuntimeOptions(inter_node_gbs=50))
    slow = step_time(LLAMA, s, acc, RuntimeOptions(inter_node_gbs=3))
    assert slow.step_seconds > fast.step_seconds
    assert "inter_node" in slow.links


def test_paged_optimizer_spills_over_the_host_link_when_it_does_not_fit() -> None:
    # 7B full fine-tune with 32-bit paged AdamW: 8 B/param of states cannot sit next to the weights on 24 GB
    small = _step(LLAMA, resolve_accelerator("rtx4090"), method="full", optimizer="paged-adamw", precision="bf16",
                  batch=1, seq=512, gradient_checkpointing=True)
    big = _step(LLAMA, resolve_accelerator("h200"), method="full", optimizer="paged-adamw", precision="bf16",
                batch=1, seq=512, gradient_checkpointing=True)
    assert small.components["paged_optimizer"] > 1.0
    assert big.components["paged_optimizer"] == 0


def test_unknown_peak_says_so_and_can_be_given() -> None:
    # a card a user describes without a tensor peak (every catalog card has one: test_time_catalog.py)
    a10g = dataclasses.replace(resolve_accelerator("a10g"), bf16_tflops_dense=None)
    s = build_setup(LLAMA, method="lora")
    with pytest.raises(UnknownThroughput):
        step_time(LLAMA, s, a10g)
    d = time_and_cost(LLAMA, s, a10g)
    assert d["time"]["tokens_per_second"] is None and "tensor peak" in d["time"]["unknown"][0]
    assert d["cost"]["cloud_usd"] is None
    ok = step_time(LLAMA, s, a10g, RuntimeOptions(peak_tflops=70))
    assert ok.tokens_per_second > 0


# ---- run time -------------------------------------------------------------------------------------


def test_dataset_rows_with_and_without_packing() -> None:
    padded = DatasetSpec(samples=1000, avg_tokens=300, epochs=2).plan(512)
    assert padded.rows_per_epoch == 1000 and padded.computed_tokens == 1000 * 512 * 2
    assert padded.real_tokens == 1000 * 300 * 2
    packed = DatasetSpec(samples=1000, avg_tokens=300, epochs=2, packing=True).plan(512)
    assert packed.rows_per_epoch == 586  # ceil(300,000 / 512)
    truncated = DatasetSpec(samples=10, avg_tokens=900).plan(512)
    assert truncated.real_tokens == 10 * 512
    tokens = DatasetSpec(dataset_tokens=1_000_000, packing=True).plan(1000)
    assert tokens.rows_per_epoch == 1000


@pytest.mark.parametrize("kw, field", [
    ({"samples": 0}, "samples"), ({"samples": 10, "epochs": 0}, "epochs"), ({"samples": 10, "avg_tokens": -1}, "avg_tokens"),
    ({"epochs": 2}, "samples"), ({"dataset_tokens": 1000}, "samples"), ({"dataset_tokens": -5, "packing": True}, "dataset_tokens"),
])
def test_bad_dataset_names_the_field(kw, field) -> None:
    with pytest.raises(TuneplanError) as e:
        DatasetSpec(**kw).validate()
    assert e.value.field == field


def test_total_hours_are_steps_times_step_time() -> None:
    acc = resolve_accelerator("a100-80gb-sxm4")
    s = build_setup(LLAMA, method="lora", batch=4, seq=512, grad_accum=2, gpus=2)
    d = time_and_cost(LLAMA, s, acc, DatasetSpec(samples=10_000, avg_tokens=400, epochs=3))
    t = d["time"]
    steps_per_epoch = -(-10_000 // (4 * 2 * 2))  # 625 optimizer steps of 16 samples
    assert t["optimizer_steps"] == 3 * steps_per_epoch
    assert t["total_hours"] == pytest.approx(3 * steps_per_epoch * t["step_seconds"] / 3600)
    assert t["gpu_hours"] == pytest.approx(2 * t["total_hours"])
    assert t["trained_tokens"] == 3 * 10_000 * 400


def test_estimate_carries_the_contract_keys() -> None:
    est = estimate(LLAMA, method="qlora", gpu="rtx4090", dataset=DatasetSpec(samples=2000, avg_tokens=256), price=0.5)
    d = est.to_dict()
    for k in ("tokens_per_second", "step_seconds", "total_hours", "gpu_hours"):
        assert d["time"][k] > 0
    for k in ("cloud_usd", "own_usd", "break_even_hours"):
        assert d["cost"][k] > 0
    assert d["cost"]["cloud_usd"] == pytest.approx(0.5 * d["time"]["gpu_hours"])
    assert isinstance(d["time"]["assumptions"], list) and isinstance(d["cost"]["assumptions"], list)
    assert "time" not in estimate(LLAMA, method="qlora").to_dict()  # no GPU, no time


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuneplan.cli.app", *args], capture_output=True, text=True,
                          timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "COLUMNS": "160"})


def test_cli_time_and_cost_flags() -> None:
    r = _cli("estimate", "meta-llama/Llama-2-7b-hf", "--method", "qlora", "--gpu", "4090", "--samples", "5000",
             "--avg-tokens", "300", "--epochs", "2", "--price", "0.4", "--kwh-price", "0.3", "--own-years", "2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["time"]["total_hours"] > 0 and d["time"]["optimizer_steps"] == 10_000
    assert d["cost"]["cloud_usd_per_gpu_hour"] == 0.4
    assert d["cost"]["power_usd_per_gpu_hour"] == pytest.approx(0.45 * 0.3)
    r = _cli("estimate", "meta-llama/Llama-2-7b-hf", "--gpu", "4090", "--epochs", "-1", "--samples", "5")
    assert r.returncode == 2 and "epochs" in r.stderr and "Traceback" not in r.stderr
