"""A trained untied head's weight gradient, made by the head's backward (the first after the loss), is a new
``.grad`` kept through every layer's backward on one GPU, under DDP and ZeRO-1: the top layer's row counts it
(estimator/head_gradient.head_gradient_in_layers)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.head_gradient import head_gradient_in_layers  # noqa: E402
from tuneplan.estimator.instants import memory_at, named  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402

# pythia-6.9b: an untied embed_out of 50,432 x 4,096 = 206,569,472 elements
HEAD = 50_432 * 4_096


def _run(**kw):
    spec = reduced_model("EleutherAI/pythia-6.9b", 3)
    setup = build_setup(spec, **{**dict(method="full", precision="bf16-mixed", framework="hf", batch=2,
                                        seq=2048, gradient_checkpointing=False, attn="eager"), **kw})
    return resolve_run(spec, setup)


def test_zero1_top_layer_counts_the_head_gradient() -> None:
    # ZeRO-1 keeps the bf16 module's param.grad whole until the boundary's reduction: 2 B x 206,569,472 =
    # 413,138,944 B beside the 1,000,000,000 B IPG bucket at the top layer (simulate: pythia-6.9b[3L] full
    # zero1 ws2 2 x 2048, the head's (50432, 4096) bf16 mm output live at the top layer's softmax backward)
    run = _run(gpus=2, zero=1)
    assert head_gradient_in_layers(run, memory_statics(run)) == 2 * HEAD == 413_138_944
    top = named(memory_at(run, 2, 2048).rows["backward_layers_top"])
    assert top.gradients == 1_000_000_000 + 413_138_944


def test_one_gpu_fp32_master_and_where_it_does_not_apply() -> None:
    # one GPU, bf16-mixed: the fp32 master's gradient, 4 B x 206,569,472 = 826,277,888 B
    run = _run()
    assert head_gradient_in_layers(run, memory_statics(run)) == 826_277_888
    # ZeRO-2 reduces it into the bucket at its hook; with accumulation the buffer is counted already
    for kw in (dict(gpus=2, zero=2), dict(grad_accum=2)):
        other = _run(**kw)
        assert head_gradient_in_layers(other, memory_statics(other)) == 0
