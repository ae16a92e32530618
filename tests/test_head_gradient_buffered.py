"""A trained untied lm_head's weight gradient made beside its accumulated ``.grad`` (estimator/
head_gradient.py): ``MmBackward`` returns ``dW = dlogits^T x`` as a new tensor and ``AccumulateGrad`` adds it
into the buffer in place; under autocast ``ToCopyBackward`` first casts it to the fp32 master's dtype.
Sizes by hand: Meta-Llama-3-8B-Instruct at 4 layers, vocab 128256 x hidden 4096 = 525,336,576 head
elements, 2 x 256 = 512 tokens, two micro-batches (simulate, seed 107 r188: 3,160,408,064 B of backward
temporaries at ``_to_copy``, the peak, 24,867,972,096 B in all)."""

from __future__ import annotations

import sys
from pathlib import Path

from tuneplan.api import build_setup, resolve_run
from tuneplan.estimator.instants import memory_at, named

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from random_setups import reduced_model  # noqa: E402

HEAD = 128256 * 4096  # 525,336,576 elements
TOKENS = 2 * 256


def _rows(precision: str, grad_accum: int) -> tuple[dict, object]:
    spec = reduced_model("meta-llama/Meta-Llama-3-8B-Instruct", 4)
    run = resolve_run(spec, build_setup(spec, method="full", precision=precision, framework="hf", batch=2,
                                        seq=256, grad_accum=grad_accum, optimizer="adamw-8bit", attn="eager"))
    return memory_at(run, 2, 256).rows, run


def test_autocast_cast_of_the_head_gradient() -> None:
    rows, run = _rows("bf16-mixed", 2)
    row = named(rows["backward_head_gradient"])
    # the cast moment: dW in bf16 (2 B) and its fp32 cast (4 B), the head input's bf16 gradient beside them
    # (the mm moment, 131,334,144 B of bf16 logit gradients + the 1,050,673,152 B bf16 head cast + dW in
    # bf16 + dx, 2,236,874,752 B, is smaller)
    assert row.backward_temp == HEAD * (2 + 4) + TOKENS * 4096 * 2 == 3_156_213_760
    # the head's saved bf16 cast was released with the MmBackward node: the layers' casts alone
    layers = 4 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336)
    assert row.autocast_copies == layers * 2 == 1_744_830_464
    # every fp32 gradient buffer of the first micro-batch
    assert row.gradients == run.param_plan.trainable_params * 4
    assert row.logits_loss == 0


def test_fp32_head_gradient_beside_the_logit_gradient() -> None:
    rows, _ = _rows("fp32", 2)
    row = named(rows["backward_head_gradient"])
    # the mm moment: the fp32 logit gradients live, dW and dx in fp32
    assert row.logits_loss == TOKENS * 128256 * 4 == 262_668_288
    assert row.backward_temp == HEAD * 4 + TOKENS * 4096 * 4 == 2_109_734_912


def test_no_buffer_no_instant() -> None:
    # one micro-batch: dW becomes ``.grad`` itself (counted with the gradients), no temporary beside it
    rows, _ = _rows("bf16-mixed", 1)
    assert "backward_head_gradient" not in rows
