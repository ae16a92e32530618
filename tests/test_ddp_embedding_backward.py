"""DDP (``gradient_as_bucket_view=False``) at a tied token embedding's backward: autograd makes the
embedding's gradient as on one GPU (the lm_head's contribution, cast to the fp32 leaf's dtype, and the
embedding's, summed out of place into ``.grad``), and the Reducer's hook copies ``.grad`` into its bucket
(reducer.cpp ``mark_variable_ready_dense``), a buffer allocated at wrap time. Sizes by hand: gemma-3-12b-it
at 3 layers, fp16 autocast over fp32 parameters, vocab 262208 x hidden 3840 (simulate: 4,027,514,880 B per
copy)."""

from __future__ import annotations

import sys
from pathlib import Path

from tuneplan.api import build_setup, resolve_run
from tuneplan.estimator.instants import memory_at, named

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from random_setups import reduced_model  # noqa: E402

EMBED32 = 262208 * 3840 * 4


def test_tied_embedding_sum_under_ddp() -> None:
    spec = reduced_model("google/gemma-3-12b-it", 3)
    run = resolve_run(spec, build_setup(spec, method="full", precision="fp16-mixed", batch=2, seq=128,
                                        gpus=2, gradient_checkpointing=True, optimizer="paged-adamw-8bit"))
    m = memory_at(run, 2, 128)
    row = named(m.rows["backward_embedding"])
    assert EMBED32 == 4_027_514_880
    # the two contributions beside their sum (the sum is the gradient itself)
    assert row.backward_temp == 2 * EMBED32
    # every parameter's fp32 .grad and its copy in DDP's buckets
    assert row.gradients == 2 * run.param_plan.trainable_params * 4
