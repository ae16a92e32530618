"""fsdp_qlora's train.py on one GPU (no FSDP): the loop binds ``output`` (the model's outputs, its logits)
for the whole step and sets ``output = None`` only after the backward and ``optimizer.step()``, so the fp32
logits its loss made (``Profile.loop_holds_outputs_to_step``; logits.py "torchtune_legacy": a contiguous
fp32 copy of the shifted logits, 4 B an element) are live at the tied embedding's backward too, the
backward's last gradient, where the lm_head's and the embedding's gradients are summed out of place.

By hand for Llama-3.2-1B at 4 layers (vocabulary 128256, tied), a full fine-tune, bf16-mixed, 1 x 1024
tokens: 1024 x 128256 x 4 = 525,336,576 B beside the embedding's backward (simulate: this draw, seed 109
r55, the peak at that sum, aten.add, with 525,337,088 B of logits, the allocator's 512-byte rounding)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.instants import memory_at, named  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402


def test_one_gpu_fsdp_qlora_holds_its_logits_at_the_tied_embedding_backward() -> None:
    spec = reduced_model("meta-llama/Llama-3.2-1B", 4)
    run = resolve_run(spec, build_setup(spec, method="full", precision="bf16-mixed", framework="fsdp-qlora",
                                        batch=1, seq=1024, grad_accum=1, optimizer="adamw-fused",
                                        attn="eager"))
    rows = memory_at(run, 1, 1024).rows
    assert named(rows["backward_embedding"]).logits_loss == 1024 * 128256 * 4 == 525_336_576
    # the HF Trainer drops its outputs before the backward: nothing held there
    hf = resolve_run(spec, build_setup(spec, method="full", precision="bf16-mixed", framework="hf", batch=1,
                                       seq=1024, grad_accum=1, optimizer="adamw-fused", attn="eager"))
    assert named(memory_at(hf, 1, 1024).rows["backward_embedding"]).logits_loss == 0
