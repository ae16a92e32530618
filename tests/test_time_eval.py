"""Evaluation work inside a timed training loop (forward-only micro-batches, generated tokens): bounds derived
by hand from the card's figures and the model's size."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.throughput import BW_EFFICIENCY, run_eval_time, run_step_time
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
