"""The step-time model over the whole catalog, its breakdown, and the relative speeds users are told."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuneplan.api import build_setup
from tuneplan.catalog.accelerators import catalog_accelerators, resolve_accelerator
from tuneplan.estimator.card_rates import GEMM_EFFICIENCY
from tuneplan.estimator.links import intra_node_link
from tuneplan.estimator.runtime import time_and_cost
from tuneplan.estimator.throughput import step_time
from tuneplan.estimator.time_statics import HOST_ADAM_BYTES_PER_PARAM, HOST_MEMORY_GBS_PER_GPU
from tuneplan.specs.dataset import DatasetSpec
from tuneplan.specs.model import model_from_config

from .conftest import LLAMA2_7B

REPO = Path(__file__).resolve().parents[1]
LLAMA = model_from_config(LLAMA2_7B, "llama-2-7b (hand config)")
DATA = DatasetSpec(samples=10_000, avg_tokens=512)


@pytest.mark.parametrize("acc_id", sorted(catalog_accelerators()))
def test_every_catalog_card_has_a_time_and_a_cost_for_a_7b_lora_run(acc_id) -> None:
    acc = catalog_accelerators()[acc_id]
    s = build_setup(LLAMA, method="lora", batch=1, seq=512)
    d = time_and_cost(LLAMA, s, acc, DATA)
    t, c = d["time"], d["cost"]
    assert t["tokens_per_second"] > 0 and t["total_hours"] > 0, t.get("unknown")
    assert c["cloud_usd"] is not None or c["own_usd"] is not None, c.get("unknown")
    assert sum(t["breakdown"].values()) == pytest.approx(t["step_seconds"])
    # a card whose figures are not verified says so, first thing
    if not t["figures_verified"]:
        assert "not verified" in t["assumptions"][0]


def test_cards_of_the_first_source_document_are_flagged_as_unverified() -> None:
    s = build_setup(LLAMA, method="lora")
    for acc_id in ("ascend-910b", "rtx-5880-ada-generation"):
        t = time_and_cost(LLAMA, s, resolve_accelerator(acc_id), DATA)["time"]
        assert t["figures_verified"] is False and t["tokens_per_second"] > 0
    assert time_and_cost(LLAMA, s, resolve_accelerator("v100-sxm2-32gb"), DATA)["time"]["figures_verified"]


strategies = st.sampled_from(["none", "ddp", "zero2", "zero3", "fsdp"])


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["full", "lora", "qlora"]), st.sampled_from([1, 4]), st.sampled_from([1, 2, 4]),
       strategies, st.sampled_from(["rtx-4090", "a100-80gb-sxm4", "h100-sxm5-80gb"]))
def test_the_breakdown_adds_up_to_the_step(method, batch, gpus, strategy, acc_id) -> None:
    kw = {"method": method, "batch": batch, "seq": 512, "gpus": gpus}
    if gpus > 1 and strategy != "none":
        kw.update({"ddp": {}, "zero2": {"zero": 2}, "zero3": {"zero": 3}, "fsdp": {"fsdp": True}}[strategy])
    st_ = step_time(LLAMA, build_setup(LLAMA, **kw), resolve_accelerator(acc_id))
    assert set(st_.breakdown) == {"compute", "memory_bound", "communication", "offload", "overhead"}
    assert all(v >= -1e-12 for v in st_.breakdown.values())
    assert sum(st_.breakdown.values()) == pytest.approx(st_.step_seconds)


def test_qlora_says_why_it_is_slower_than_lora() -> None:
    acc = resolve_accelerator("a100-80gb-sxm4")
    q = time_and_cost(LLAMA, build_setup(LLAMA, method="qlora", gradient_checkpointing=True), acc,
                      DATA)["time"]
    lo = time_and_cost(LLAMA, build_setup(LLAMA, method="lora", gradient_checkpointing=True), acc,
                       DATA)["time"]
    assert q["step_seconds"] > lo["step_seconds"]
    assert q["breakdown_detail"]["dequantization"] > 0 and "dequantization" not in lo["breakdown_detail"]
    why = [a for a in q["assumptions"] if "16-bit copy" in a]
    assert why and "forward" in why[0] and "backward" in why[0] and "recomputation" in why[0]
    assert not [a for a in lo["assumptions"] if "16-bit copy" in a]


def test_a_card_without_tensor_cores_runs_16bit_matmuls_at_its_fp32_rate() -> None:
    p100 = resolve_accelerator("p100-pcie-16gb")  # Pascal: no tensor cores, 9.3 TFLOPS fp32 (catalog)
    s = build_setup(LLAMA, method="lora", batch=8, seq=2048)
    st_ = step_time(LLAMA, s, p100)
    fl = st_.flops
    # by hand: the matmul FLOPs of the step at 9.3 TFLOPS x the GDDR/HBM NVIDIA efficiency
    assert st_.components["matmul"] == pytest.approx(fl.total * 8 * 2048
                                                     / (9.3e12 * GEMM_EFFICIENCY["nvidia-hbm"]))


def test_cpu_offload_counts_the_cpu_optimizer_step() -> None:
    acc = resolve_accelerator("rtx-4090")
    on = step_time(LLAMA, build_setup(LLAMA, method="full", zero=3, gpus=2, offload="optimizer"), acc)
    # by hand: each rank updates half of the 6.74e9 parameters, 30 B of host memory traffic each, at 20 GB/s
    cpu_s = LLAMA.params_total / 2 * HOST_ADAM_BYTES_PER_PARAM / (HOST_MEMORY_GBS_PER_GPU * 1e9)
    assert cpu_s > 4  # 3.37e9 x 30 B / 20 GB/s = 5.1 s
    assert on.breakdown["offload"] >= cpu_s * 0.99


def test_relative_speeds_the_source_documents_state() -> None:
    """'A100 is about 3 times an RTX 3090 on the same task': reproduced for a 7B LoRA (ratio between the
    memory-bound ratio 2039/936 = 2.2 and the tensor-peak ratio 312/71 = 4.4; the 35 TFLOPS quoted for the
    3090 is its fp32 rate, not its 16-bit tensor rate). 'HBM is far faster than GDDR, NVLink far faster than
    PCIe' for the parts bound by them: the memory-bound seconds scale with 1/bandwidth, an NVLink ring is
    ~10x a PCIe one."""
    s = build_setup(LLAMA, method="lora", batch=4, seq=512)
    a100, r3090 = resolve_accelerator("a100-80gb-sxm4"), resolve_accelerator("rtx-3090")
    ratio = step_time(LLAMA, s, r3090).step_seconds / step_time(LLAMA, s, a100).step_seconds
    assert 2.2 < ratio < 4.4
    assert 2039 / 936 * 0.9 < (step_time(LLAMA, s, r3090).breakdown["memory_bound"]
                               / step_time(LLAMA, s, a100).breakdown["memory_bound"]) < 2039 / 936 * 1.1
    nvlink = intra_node_link(a100, 8).gbs  # 600 GB/s both ways -> 300 one way x 0.78
    pcie = intra_node_link(resolve_accelerator("a100-80gb-pcie"), 8).gbs  # gen4 x16 31.5 x 0.7
    assert nvlink == pytest.approx(300 * 0.78) and pcie == pytest.approx(31.5 * 0.7)
    assert nvlink / pcie > 10


def _build_module():
    spec = importlib.util.spec_from_file_location("build_accelerators", REPO / "tools/build_accelerators.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_filled_figures_are_named_and_never_replace_a_published_value(tmp_path) -> None:
    mod = _build_module()
    entries = [{"id": "x", "bf16_tflops_dense": None, "memory_bandwidth_gbs": 100.0,
                "unverified_or_derived_fields": None, "notes": None, "cloud_usd_per_gpu_hr": None,
                "price_basis_and_date": None, "cloud_price_date": None}]
    f = tmp_path / "fig.csv"
    with f.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "field", "value", "source", "verified"])
        w.writerow(["x", "bf16_tflops_dense", "50", "a derivation", "no"])
    out = mod.fill_time_figures([dict(e) for e in entries], f)
    assert out[0]["bf16_tflops_dense"] == 50.0 and "bf16_tflops_dense 50 filled in: a derivation" in \
        out[0]["unverified_or_derived_fields"]
    with f.open("a", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerow(["x", "memory_bandwidth_gbs", "200", "another", "no"])
    with pytest.raises(SystemExit, match="published"):
        mod.fill_time_figures([dict(e) for e in entries], f)


def test_every_filled_figure_names_a_source() -> None:
    rows = list(csv.DictReader((REPO / "tools/accelerator_figures.csv").open(encoding="utf-8")))
    assert rows and all(r["source"].strip() and r["verified"] in ("yes", "no") for r in rows)


def test_the_text_output_prints_the_breakdown_on_one_line() -> None:
    from tuneplan.cli.render import time_breakdown_line

    acc = resolve_accelerator("rtx-5880-ada-generation")
    t = time_and_cost(LLAMA, build_setup(LLAMA, method="qlora", gradient_checkpointing=True), acc,
                      DATA)["time"]
    line = time_breakdown_line(t)
    assert line.startswith(f"step {t['step_seconds']:.3g} s = compute ")
    assert "memory-bound" in line and "dequantization" in line
    # one bound, the one that limits: the largest part of this step is the memory traffic (72 %)
    assert t["bound"] == "memory" and line.split("; ")[-1].startswith("memory-bound")
    assert "not verified" in line  # the RTX 5880 Ada's figures have no source


def _op_counter():
    """A TorchDispatchMode that counts every aten op dispatched inside it (``.ops``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    return Count()


def test_dispatched_ops_per_counted_kernel() -> None:
    """OPS_PER_KERNEL (2.6) is what transformers' own Llama code dispatches per kernel that compute.py
    counts: run a tiny LlamaForCausalLM forward + backward under a TorchDispatchMode on the CPU and count
    aten ops per layer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tuneplan.estimator.compute import flops_per_token
    from tuneplan.estimator.launch_costs import OPS_PER_KERNEL

    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 64,
           "architectures": ["LlamaForCausalLM"]}

    def dispatched(layers: int) -> int:
        torch.manual_seed(0)
        m = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"},
                                         num_hidden_layers=layers, attn_implementation="sdpa"))
        m.train()
        x = torch.randint(0, 256, (1, 32))
        with _op_counter() as c:
            m(input_ids=x, labels=x).loss.backward()
        return c.ops

    def counted(layers: int) -> float:
        spec = model_from_config({**cfg, "num_hidden_layers": layers}, "tiny")
        f = flops_per_token(spec, build_setup(spec, method="full", batch=1, seq=32, framework="hf",
                                              attn="sdpa", gradient_checkpointing=False))
        return f.gemm_kernels + f.other_kernels

    ratio = (dispatched(4) - dispatched(2)) / (counted(4) - counted(2))  # per decoder layer
    assert 2.2 < ratio < 3.0
    assert abs(ratio - OPS_PER_KERNEL) < 0.4


def test_fsdp_ops_per_unit() -> None:
    """FSDP_UNIT_OPS_*: run transformers' Llama wrapped per decoder layer in FSDP1 (world size 2, fake
    process group, CPU) and unwrapped; the extra aten ops per layer of one forward + backward are FSDP's
    per-unit work."""
    import functools

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from tuneplan.estimator.launch_costs import FSDP_UNIT_OPS_FULL

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        def ops(layers: int, fsdp: bool) -> int:
            torch.manual_seed(0)
            m = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                             num_attention_heads=4, num_key_value_heads=4, vocab_size=256,
                                             max_position_embeddings=64, attn_implementation="sdpa"))
            if fsdp:
                policy = functools.partial(transformer_auto_wrap_policy,
                                           transformer_layer_cls={LlamaDecoderLayer})
                m = FullyShardedDataParallel(m, device_id=torch.device("cpu"), use_orig_params=True,
                                             auto_wrap_policy=policy)
            m.train()
            x = torch.randint(0, 256, (1, 32))
            m(input_ids=x, labels=x).loss.backward()  # first step builds FSDP's state
            with _op_counter() as c:
                m(input_ids=x, labels=x).loss.backward()
            return c.ops

        extra = ((ops(4, True) - ops(2, True)) - (ops(4, False) - ops(2, False))) / 2
    finally:
        if started:
            dist.destroy_process_group()
    assert abs(extra - FSDP_UNIT_OPS_FULL) <= 10
