"""FSDP1's root unit beside the shard an all-gather reads: at its pre-forward
(wrappers/fsdp1_offload.root_forward_unshard) and at its pre-backward prefetching the top layer
(wrappers/fsdp1_offload.root_pre_backward_gathered):
before the loss's backward makes any gradient, the root's ``_pre_backward_hook`` all-gathers the top layer
(BACKWARD_PRE), whose all-gather reads a shard that lives only then.

By hand for Llama-3.1-405B at 3 layers (hidden 16384, intermediate 53248, 8 KV heads of 128, vocabulary
128256, untied), QLoRA nf4 (double quantization) r4 on the attention, bf16-mixed: fsdp_qlora's train.py
gathers in fp32 (MixedPrecision param_dtype fp32 over bf16-stored 4-bit codes), on 2 GPUs, no offload:

* a layer: q, o 16384 x 16384, k, v 16384 x 1024, gate, up, down 16384 x 53248: 3,187,671,040 codes, two a
  byte, stored as 796,917,760 bf16 elements, and the two norms' 2 x 16384: 796,950,528 elements, gathered
  in fp32: 3,187,802,112 B;
* its low-precision shard (``_use_low_precision_shard``), 1/2 of it in fp32: 1,593,901,056 B, alive while
  the all-gather reads it;
* the root (embeddings, lm_head 128256 x 16384 each, final norm 16384) in fp32: 4,202,708,992 x 4 =
  16,810,835,968 B;
together 21,592,539,136 B (simulate: fsdp_qlora, this draw, seed 101 r253: its peak at that all-gather,
parallel buffers 21,592,539,136 B)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402


def test_root_pre_backward_prefetches_the_top_layer_beside_its_all_gather_shard() -> None:
    spec = reduced_model("meta-llama/Llama-3.1-405B-Instruct", 3)
    run = resolve_run(spec, build_setup(
        spec, method="qlora", precision="bf16-mixed", framework="fsdp-qlora", batch=1, seq=384, grad_accum=1,
        gradient_checkpointing=True, bits=4, quant_type="nf4", double_quant=True, rank=4, targets="attn",
        optimizer="adamw", attn="eager", gpus=2, fsdp=True, fsdp_version=1, offload="none"))
    gathered = run.wrapper.memory(run, memory_statics(run).optimizer).gathered
    root = (2 * 128256 * 16384 + 16384) * 4
    layer = (3_187_671_040 // 4 + 2 * 16384) * 4
    assert layer == 3_187_802_112
    assert gathered.at_loss == root + layer
    assert gathered.root_pre_backward == root + layer + layer // 2 == 21_592_539_136


def test_root_forward_unshard_beside_its_low_precision_shard() -> None:
    # DeepSeek-R1-Distill-Llama-8B (untied, vocabulary 128256, hidden 4096) QLoRA under fp16-mixed: the root
    # (2 x 128256 x 4096 + 4096 = 1,050,677,248 parameters, fp16 flat parameter) is all-gathered in fp32 at
    # the forward's start, its all-gather reading the fp32 low-precision shard of half of it: 4,202,708,992
    # + 2,101,354,496 B, before anything is saved (simulate: fsdp_qlora, seed 79 r274, the first step's peak)
    spec = reduced_model("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", 2)
    run = resolve_run(spec, build_setup(
        spec, method="qlora", precision="fp16-mixed", framework="fsdp-qlora", batch=2, seq=64, grad_accum=1,
        bits=4, quant_type="fp4", double_quant=True, rank=128, targets="all-linear", dropout=0.05,
        optimizer="adamw-hf", gpus=2, fsdp=True, fsdp_version=1, offload="none"))
    gathered = run.wrapper.memory(run, memory_statics(run).optimizer).gathered
    root = (2 * 128256 * 4096 + 4096) * 4
    assert root == 4_202_708_992
    assert gathered.bottom_layer_forward == root + root // 2 == 6_304_063_488
