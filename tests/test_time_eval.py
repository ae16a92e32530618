"""Evaluation work inside a timed training loop (forward-only micro-batches, generated tokens): bounds derived
by hand from the card's figures and the model's size."""

from __future__ import annotations

import pytest

from tuneplan.api import build_setup
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.estimator.card_rates import BW_EFFICIENCY
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.throughput import run_eval_time, run_step_time
from tuneplan.specs.model import model_from_config

from .conftest import LLAMA2_7B

LLAMA = model_from_config(LLAMA2_7B, "llama-2-7b (hand config)")
WEIGHT_BYTES_16BIT = 6_738_415_616 * 2  # Llama-2-7B's parameters (its model card: 6.74 B) x 2 bytes


def _run(**kw):
    return resolve_run(LLAMA, build_setup(LLAMA, framework="litgpt", **kw))


def test_a_generated_token_reads_every_weight_once() -> None:
    """Batch 1 with a KV cache: one read of the 13.5 GB of 16-bit weights at the streaming rate at least."""
    acc = resolve_accelerator("a100-80gb-sxm4")
    et = run_eval_time(_run(method="lora", batch=2, seq=512), acc)
    floor = WEIGHT_BYTES_16BIT / (acc.memory_bandwidth_gbs * 1e9 * BW_EFFICIENCY)
    assert et.token_seconds >= floor * 0.99
    assert et.token_seconds < 10 * floor  # and not some unrelated multiple of it


def test_a_forward_only_micro_batch_is_cheaper_than_a_training_one() -> None:
    acc = resolve_accelerator("a10g")
    run = _run(method="lora", batch=4, seq=512)
    et, st = run_eval_time(run, acc), run_step_time(run, acc)
    # forward alone: 2 FLOPs per weight per token, at most the card's dense peak
    assert et.forward_seconds >= 2 * 6.7e9 * 4 * 512 / (acc.bf16_tflops_dense * 1e12)
    assert et.forward_seconds < st.micro_batch_seconds


def test_sharded_generation_gathers_the_model_for_every_token() -> None:
    """FSDP on 2 cards: each token all-gathers the half of the 16-bit weights a card lacks over the link."""
    acc = resolve_accelerator("a10g")
    kw = {"method": "full", "batch": 1, "seq": 512, "gradient_checkpointing": True}
    one = run_eval_time(_run(**kw), acc)
    two = run_eval_time(_run(**kw, gpus=2, fsdp=True), acc)
    pcie4_x16_one_way = 31.5e9  # PCI-SIG: 16 GT/s x 16 lanes, 128b/130b
    assert two.token_seconds - one.token_seconds >= WEIGHT_BYTES_16BIT / 2 / pcie4_x16_one_way


def test_dequantization_traffic_follows_the_kernel_that_rebuilds_the_weight() -> None:
    """Bytes per weight element and pass at 70 % of peak bandwidth, by hand: bitsandbytes (0.5 B codes read,
    2 B written, x2 for the pre-0.48 branchy kernel, then 2 B read by the GEMM) 7 / 0.7 = 10; torchao NF4
    compiled into one kernel (0.5 + 2, then 2) 4.5 / 0.7; torchao eager, every op of get_original_weight
    traced (shifts, int64 casts, lookups, scaler copies, multiplies, stack: 17 B written, 16 B read, then 2)
    35 / 0.7, in ~15 kernels instead of 1."""
    from tuneplan.estimator.dequant_time import dequant_bytes_per_weight, kernels_per_dequant

    q = build_setup(LLAMA, method="qlora", batch=1, seq=512)
    assert dequant_bytes_per_weight(q, "hf", False) == pytest.approx(7 / 0.7)
    assert dequant_bytes_per_weight(q, "torchtune", True) == pytest.approx(4.5 / 0.7)
    assert dequant_bytes_per_weight(q, "torchtune", False) == pytest.approx(35 / 0.7)
    assert kernels_per_dequant(q, "hf", False) == kernels_per_dequant(q, "torchtune", True) == 1
    assert kernels_per_dequant(q, "torchtune", False) > 10


def test_a_per_tensor_optimizer_step_takes_its_launches() -> None:
    """LoRA on q_proj and v_proj of a 32-layer model: 32 x 2 x 2 = 128 trainable tensors. transformers'
    AdamW dispatches 7 ops per tensor at 15 us each: 13.4 ms a step, far above the memory time of 4 M
    parameters; torch's foreach AdamW: 9 ops per chunk of 48 tensors (3 chunks), 0.4 ms."""
    from tuneplan.estimator.throughput import step_time

    acc = resolve_accelerator("a100-80gb-sxm4")
    kw = {"method": "lora", "targets": "q_proj,v_proj", "batch": 1, "seq": 256}
    hf = step_time(LLAMA, build_setup(LLAMA, optimizer="adamw-hf", **kw), acc)
    launched = hf.breakdown_detail["optimizer_update"] + hf.breakdown_detail["optimizer_launches"]
    assert launched == pytest.approx(7 * 128 * 15e-6, rel=0.01)
    foreach = step_time(LLAMA, build_setup(LLAMA, optimizer="adamw", **kw), acc)
    detail = foreach.breakdown_detail
    took = detail["optimizer_update"] + detail.get("optimizer_launches", 0.0)
    assert took == pytest.approx(max(9 * 3 * 15e-6, foreach.components["optimizer"]), rel=0.01)
    assert hf.step_seconds > foreach.step_seconds


def test_litgpt_rebuilds_its_quantized_head_for_every_chunk() -> None:
    """LitGPT quantizes the lm_head too and applies it 128 tokens at a time: each chunk dequantizes the whole
    32,000 x 4,096 head in forward and again for its input gradient. 300 tokens are 3 chunks, 128 are 1:
    the difference is 2 chunks x 2 passes x 131,072,000 elements. transformers leaves the head in 16 bits."""
    from tuneplan.estimator.compute import flops_at
    from tuneplan.estimator.time_statics import RuntimeOptions, time_statics

    acc = resolve_accelerator("a10g")
    plan = time_statics(_run(method="qlora", batch=1, seq=300), acc, RuntimeOptions()).flops
    head = 32_000 * 4_096
    assert flops_at(plan, 300).dequant_elements - flops_at(plan, 128).dequant_elements == 2 * 2 * head
    hf = resolve_run(LLAMA, build_setup(LLAMA, framework="hf", method="qlora", batch=1, seq=300))
    hf_plan = time_statics(hf, acc, RuntimeOptions()).flops
    assert flops_at(hf_plan, 300).dequant_elements == flops_at(hf_plan, 128).dequant_elements
