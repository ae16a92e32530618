"""On one GPU without checkpointing, autocast's 16-bit cast of an fp32 lm_head is saved for the head's
input-gradient matmul (autocast_mode.cpp ``cached_cast``) and dies with the head's backward, which autograd
runs before the top layer's (the head is the last op of the forward): the top layer's backward row holds
every other saved cast, not the head's (estimator/instants.layer_backward_rows,
layer_end_casts.head_and_top_layer_casts)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.instants import memory_at  # noqa: E402
from tuneplan.estimator.memory import memory_breakdown  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402

# falcon-40b: h 8192, vocab 65024, fused query_key_value 8192 -> (128 + 2 x 8) x 64 = 9216
H, V, QKV, RANK = 8192, 65024, 9216, 128


def _setup(spec):
    return build_setup(spec, method="qlora", precision="bf16-mixed", framework="hf", batch=1, seq=256,
                       gradient_checkpointing=False, bits=4, quant_type="fp4", double_quant=True, rank=RANK,
                       dropout=0.05, optimizer="paged-adamw-8bit", attn="flash")


def test_top_layer_row_keeps_only_the_adapters_casts() -> None:
    # the fp32 head's bf16 cast, V x h x 2 = 1,065,353,216 B, is gone by the top layer's backward; what is
    # left are the fp32 LoRA adapters' bf16 casts on query_key_value, 3 layers x r (h + 9216) x 2 B
    spec = reduced_model("tiiuae/falcon-40b", 3)
    at = memory_at(resolve_run(spec, _setup(spec)), 1, 256)
    head_cast = V * H * 2
    adapters_casts = 3 * RANK * (H + QKV) * 2
    assert (head_cast, adapters_casts) == (1_065_353_216, 13_369_344)
    assert at.components("backward_start")["autocast_copies"] == head_cast + adapters_casts
    assert at.components("backward_layers_top")["autocast_copies"] == adapters_casts


def test_peak_is_the_loss_backward() -> None:
    # simulate (seed 79 r102): the peak, 4,655,953,408 B, is the loss's backward (_log_softmax_backward_data),
    # the head's cast still saved; the top layer's backward peaks about 1 GiB lower once it is released
    spec = reduced_model("tiiuae/falcon-40b", 3)
    ana = memory_breakdown(spec, _setup(spec))
    assert ana.peak_instant == "backward_start"
    assert abs(ana.allocated_peak_bytes / 4_655_953_408 - 1) < 0.03
