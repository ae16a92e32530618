"""Under gradient checkpointing one layer is recomputed and back-propagated at a time, so its backward scratch
sits beside its own recomputation (torch/utils/checkpoint.py: each checkpointed segment reruns its forward
inside its own backward). A model whose layers differ (a first layer whose input needs no gradient, a dense
layer below MoE ones) peaks at the largest layer's recomputation plus that layer's scratch, not the largest
recomputation plus another layer's scratch. Expected figures counted by hand."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.activations import saved_at  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402


def test_phi_recomputed_layer_with_its_own_attention_scratch() -> None:
    # phi-1_5 at 2 layers, QLoRA on q_proj / v_proj, eager attention, bf16-mixed, checkpointed, 2 x 2048:
    # 4096 tokens, 2 x 2048 x 2048 = 8388608 (query, key) pairs, 32 heads, hidden 2048, rank 128.
    # The top layer (modeling_phi PhiDecoderLayer: attention and MLP in parallel on one LayerNorm; the MLP
    # runs second, so autograd back-propagates it first) at softmax's backward keeps, per token: the norm's
    # mean and rstd (8 B), q and v's LoRA inputs cast to bf16 (2 x 4096 B) and r-wide middles (2 x 256 B),
    # q and k for the scores (2 x 4096 B); beside them two fp32 residual gradients (2 x 8192 B):
    # 8 + 8192 + 512 + 8192 + 16384 = 33288 B. Per pair and head: the fp32 probabilities softmax saved, the
    # fp32 gradient ToCopyBackward hands it, and the fp32 scores' gradient it writes: 12 x 32 = 384 B.
    # (The bottom layer, whose input needs no gradient, records no MLP and a larger scratch net of it, but
    # its sum is smaller: it used to be added to the top layer's recomputation.)
    spec = reduced_model("microsoft/phi-1_5", 2)
    setup = build_setup(spec, method="qlora", precision="bf16-mixed", framework="hf", batch=2, seq=2048,
                        gradient_checkpointing=True, attn="eager", rank=128, bits=4, quant_type="nf4",
                        double_quant=False)
    plan = saved_at(memory_statics(resolve_run(spec, setup)).acts, 2, 2048)
    assert plan.recompute_bytes + plan.backward_temp_bytes == 33288 * 4096 + 384 * 8388608
