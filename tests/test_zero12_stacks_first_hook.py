"""ZeRO-1/2's IPG bucket in a LoRA run on transformers 5's fused expert stacks (wrapper_rows.
stacks_first_hook_rows), by hand from DeepSpeed 0.19.8's stage_1_and_2.py and PEFT's ParamWrapper: the
bucket (``setup_buckets``, 5e8 elements in bf16: 1,000,000,000 bytes) is allocated by the first gradient
hook, a factor gradient of the top layer's stacks, made after grouped_mm's backward has used and released
each stack's saved effective weight ``baddbmm(W, B, A)``.

Qwen3-30B-A3B at 4 layers, LoRA on the MLP (PEFT moves gate/up/down onto the stacks) over 4 GPUs, ZeRO-2
with the optimizer offloaded, 1 x 256 tokens (simulate: held-103 r177, the peak at the loss backward; the
bucket made after the top layer's gate_up (128 x 1536 x 2048) and down (128 x 2048 x 768) effective
weights are freed): those two bf16 weights are 805,306,368 + 402,653,184 = 1,207,959,552 bytes."""

from __future__ import annotations

import sys
from pathlib import Path

from tuneplan.api import build_setup
from tuneplan.estimator.instants import memory_at
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.reduce_buckets import first_hook_after_stacks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from random_setups import reduced_model  # noqa: E402

BUCKET = 1_000_000_000
STACKS = 2 * (128 * 1536 * 2048 + 128 * 2048 * 768)


def qwen3_moe_lora():  # type: ignore[no-untyped-def]
    spec = reduced_model("Qwen/Qwen3-30B-A3B", 4)
    setup = build_setup(spec, method="lora", precision="bf16-mixed", optimizer="adamw", gpus=4, zero=2,
                        offload="optimizer", rank=4, targets="mlp", batch=1, seq=256)
    return resolve_run(spec, setup)


def test_the_first_hook_follows_the_top_layers_stacks() -> None:
    run = qwen3_moe_lora()
    assert first_hook_after_stacks(run.model, run.targets, run.setup.rank)
    assert STACKS == 1_207_959_552


def test_the_top_layers_stacks_are_back_propagated_before_the_bucket() -> None:
    live = memory_at(qwen3_moe_lora(), 1, 256)
    rows = live.rows
    top, hook = rows["backward_layers_top"], rows["backward_first_hook"]
    assert hook[0] - top[0] == BUCKET  # the top layer's stack moment without the bucket
    assert hook[2] == top[2] - STACKS  # the bucket beside every activation but the top layer's stacks
    below = rows["backward_layer_below_top"]
    acts = live.acts
    assert below[0] == hook[0] and below[2] == acts.saved_bytes - acts.tail_bytes - acts.top_layer_bytes
