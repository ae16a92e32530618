"""Rank 0's gradient partition in a freeze run (wrappers/zero12_reductions.zero12_rank0_params), by hand from
DeepSpeed 0.19.8's stage_1_and_2.py: the flat 16-bit group holds the trained tensors in module order and
``copy_grads_in_partition`` allocates ``grads_in_partition`` over every parameter overlapping rank 0's
slice (``params_in_partition``), counted whole.

Mixtral-8x7B at 4 layers, its top 2 trained, over 8 GPUs (simulate: held-101 r46, ``grads_in_partition``
of 981,499,904 elements, twice with an accumulation). Per layer, in module order: q and o 16,777,216, k and
v 4,194,304, the router 8 x 4096 = 32,768 (transformers builds it before the experts), the fused
``gate_up_proj`` 8 x 28,672 x 4096 = 939,524,096, ``down_proj`` 8 x 4096 x 14,336 = 469,762,048, the norms
8,192: 1,451,270,144 a layer, 2,902,540,288 trained, a slice of 362,817,536. The slice ends inside the
first trained layer's gate_up stack, held whole: 41,943,040 + 32,768 + 939,524,096 = 981,499,904."""

from __future__ import annotations

import sys
from pathlib import Path

from tuneplan.api import build_setup
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero12_reductions import zero12_rank0_params

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from random_setups import reduced_model  # noqa: E402

LAYER = 2 * 16_777_216 + 2 * 4_194_304 + 32_768 + 939_524_096 + 469_762_048 + 8_192


def mixtral_freeze():  # type: ignore[no-untyped-def]
    spec = reduced_model("mistralai/Mixtral-8x7B-v0.1", 4)
    setup = build_setup(spec, method="freeze", precision="bf16", optimizer="sgd", gpus=8, zero=2,
                        grad_accum=2, batch=1, seq=64)
    return resolve_run(spec, setup)


def test_a_freeze_slice_holds_the_expert_stack_it_ends_in() -> None:
    run = mixtral_freeze()
    assert LAYER == 1_451_270_144
    assert run.param_plan.trainable_params == 2 * LAYER
    assert zero12_rank0_params(run, 2 * LAYER // 8) == 981_499_904


def test_the_partition_made_with_the_stack_pending() -> None:
    # the lower trained layer's router hook reduces the pending gate_up gradient: the new partition is made
    # beside the kept one, the bucket (5e8 bf16), that gradient and the router's own (simulate: the peak, at
    # that ``empty``, holds the two 1,962,999,808-byte partitions, the bucket and the 8 x 28,672 x 4096 stack)
    partition = 2 * 981_499_904
    wrapped = memory_statics(mixtral_freeze()).wrapped
    assert wrapped.layers_backward == partition + 1_000_000_000 + 2 * (939_524_096 + 32_768) + partition


def test_a_freeze_runs_partition_is_made_by_the_reduction_reaching_the_slice() -> None:
    # falcon-40b at 2 layers, both trained, over 4 GPUs (simulate: held-97 r93). A layer in module order:
    # query_key_value 8192 x 9216 = 75,497,472, dense 67,108,864, dense_h_to_4h and dense_4h_to_h
    # 268,435,456 each, four norm tensors of 8,192: 679,510,016; 1,359,020,032 trained, a slice of
    # 339,755,008, covered by layer 0's qkv, dense and h_to_4h (411,041,792). The hooks, from layer 1's
    # 4h_to_h, reduce 268,435,456 (layer 1's 4h_to_h), 411,074,560 (its h_to_4h, dense, qkv, norms),
    # 268,435,456 (layer 0's 4h_to_h): 947,945,472 elements from the flat group's end, short of the slice
    # (1,359,020,032 - 339,755,008 = 1,019,265,024 from the end). The epilogue's reduction (layer 0's
    # h_to_4h, dense, qkv and norms: 411,074,560) copies its slices, then makes the partition: at the copy
    # only the bucket and the partition the accumulation kept, 1e9 + 822,083,584 + 822,149,120 =
    # 2,644,232,704 bytes, below the first reduction's moment (zero12_reductions.zero2_epilogue's
    # ``on_flush``: layer 1's 4h_to_h copied beside its h_to_4h gradient, 2 x 268,435,456 each)
    spec = reduced_model("tiiuae/falcon-40b", 2)
    setup = build_setup(spec, method="freeze", precision="bf16", optimizer="paged-adamw", gpus=4, zero=2,
                        grad_accum=2, batch=1, seq=384, framework="llamafactory")
    run = resolve_run(spec, setup)
    assert run.param_plan.trainable_params == 2 * 679_510_016
    assert zero12_rank0_params(run, 339_755_008) == 411_041_792
    epilogue = memory_statics(run).wrapped.epilogue
    assert epilogue is not None
    kept, layer_mlp = 2 * 411_041_792, 2 * 268_435_456
    assert 1_000_000_000 + kept + 2 * 411_074_560 < 1_000_000_000 + kept + 2 * layer_mlp
    assert (epilogue.gradients, epilogue.reduction_copy) == (1_000_000_000 + kept + layer_mlp, layer_mlp)
