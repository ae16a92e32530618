"""A full fine-tune's bottom layer on one GPU: each weight's gradient is made by the backward of the op that
saved the activation it reads (``MmBackward0`` returns the weight's gradient and frees its saved input), so
the bottom layer's row is the larger of its start (its activations, none of its gradients) and its end (its
gradients, its activations released), not both at once (estimator/memory_statics.bottom_own_gradients)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.memory import memory_breakdown  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402

# Llama-2-13b (h 5120, MLP 13824, vocab 32000), 2 layers, full fp32, 1 x 2048 tokens, checkpointed
H, F, V = 5120, 13824, 32000


def _setup(spec, **kw):
    return build_setup(spec, method="full", precision="fp32", framework="hf", batch=1, seq=2048,
                       gradient_checkpointing=True, optimizer="paged-adamw", attn="flash", **kw)


def test_bottom_layer_own_gradients_are_its_weights() -> None:
    # one layer: q, k, v, o (4 h^2) + gate, up, down (3 h f) + two RMSNorms (2 h) = 317,204,480 fp32
    # gradients, none of them cast (fp32 compute)
    spec = reduced_model("meta-llama/Llama-2-13b-hf", 2)
    own = 4 * H * H + 3 * H * F + 2 * H
    assert memory_statics(resolve_run(spec, _setup(spec))).bottom_own_grads == 4 * own == 1_268_817_920


def test_bottom_layer_row_releases_its_recomputation() -> None:
    # the layer's recomputed activations (about 792 MiB at 2048 tokens: two 108 MiB MLP-wide and a few
    # 40 MiB hidden-wide fp32 tensors) are fewer bytes than its own gradients (1210 MiB), so at its end
    # none of them remain: the row is every gradient but the embedding's (2 x 317,204,480 + 32000 x 5120
    # lm_head + 5120 norm, fp32) beside the layer's scratch; the peak is then the embedding's backward,
    # every gradient beside the two fp32 hidden-wide tensors of embedding_dense_backward (simulate: 7814 MB)
    spec = reduced_model("meta-llama/Llama-2-13b-hf", 2)
    ana = memory_breakdown(spec, _setup(spec))
    weights = 4 * (2 * (4 * H * H + 3 * H * F + 2 * H) + 2 * V * H + H)
    grads_below_embedding = weights - 4 * V * H
    scratch = ana.instants["backward_layers_bottom"] - (weights + 32 * 2**20 + grads_below_embedding)
    assert scratch < 10 * 2048 * H * 4  # the scratch alone, no 792 MiB recomputation beside it
    assert ana.peak_instant == "backward_embedding"
    assert ana.instants["backward_embedding"] - 2 * weights - 32 * 2**20 - 2 * 2048 * H * 4 < 2**16


def test_accumulated_gradients_keep_the_whole_row() -> None:
    # with accumulation the gradients are buffers already there (AccumulateGrad adds into them): nothing new
    spec = reduced_model("meta-llama/Llama-2-13b-hf", 2)
    assert memory_statics(resolve_run(spec, _setup(spec, grad_accum=2))).bottom_own_grads == 0
