"""ZeRO-2's step takes the gradients' norm before it flattens them (DeepSpeed stage_1_and_2.py ``step`` ->
``scaled_global_norm`` -> ``get_grad_norm_direct``): each view of ``averaged_gradients`` (one per parameter
overlapping rank 0's slice, in ``grads_in_partition``, allocated whole) is copied to fp64
(``get_norm_dtype()``) for its norm, beside that buffer (wrappers/zero12_reductions.zero2_norm_moment)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.memory import memory_breakdown  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402
from tuneplan.estimator.wrappers.zero12_reductions import zero2_norm_moment  # noqa: E402

# Mixtral-8x22B: h 6144, 8 KV heads of 128 (k, v: 1024 x h), 8 experts of f 16384 fused as gate_up_proj
# (8 x 32768 x h) and down_proj (8 x h x 16384), router 8 x h
H = 6144
ATTN = 2 * H * H + 2 * 1024 * H  # q, o, k, v: 88,080,384
ROUTER, GATE_UP, DOWN, NORMS = 8 * H, 8 * 32768 * H, 8 * H * 16384, 2 * H
LAYER = ATTN + ROUTER + GATE_UP + DOWN + NORMS  # 2,504,060,928


def _setup(spec):
    return build_setup(spec, method="freeze", precision="bf16", framework="hf", batch=1, seq=128,
                       grad_accum=2, optimizer="sgd", attn="sdpa", gpus=4, zero=2, offload="none")


def test_norm_copies_the_largest_view_in_fp64() -> None:
    # freeze trains the top 2 of 3 layers: 2 x 2,504,060,928 parameters, rank 0's slice a quarter of them,
    # 1,252,030,464: q, k, v, o, the router (88,129,536) and 1,163,900,928 of the 1,610,612,736 gate_up_proj
    # elements; grads_in_partition holds the five whole tensors before it, 1,698,742,272 bf16 elements
    spec = reduced_model("mistralai/Mixtral-8x22B-v0.1", 3)
    partition = 2 * LAYER // 4
    assert partition == 1_252_030_464
    covered = ATTN + ROUTER + GATE_UP
    assert covered == 1_698_742_272
    largest = partition - ATTN - ROUTER
    assert largest == 1_163_900_928
    assert zero2_norm_moment(resolve_run(spec, _setup(spec)), partition) == (2 * covered, 8 * largest)


def test_peak_is_the_norm() -> None:
    # simulate (seed 79 r124): 33,580,058,112 B at linalg_vector_norm: bf16 weights 15,829,685,248, the fp32
    # master partition 5,008,121,856, cuBLAS workspace 33,554,432, grads_in_partition 3,397,484,544, the
    # fp64 view 9,311,207,424 (+ a 1 KiB tensor and the norms' 512 B scalars)
    spec = reduced_model("mistralai/Mixtral-8x22B-v0.1", 3)
    ana = memory_breakdown(spec, _setup(spec))
    assert ana.peak_instant == "optimizer_step"
    assert abs(ana.allocated_peak_bytes - 33_580_058_112) < 2**16
