"""ZeRO-1/2's reductions at the end of the backward (estimator/wrappers/zero12_reductions.py), by hand from
DeepSpeed 0.19.8's stage_1_and_2.py on Qwen2.5-7B (embedding and head 152,064 x 3,584 = 544,997,376
elements each, above the default 5e8-element bucket)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run

EMBED = 152_064 * 3_584
BUCKET = 500_000_000


def test_zero1_offload_reduces_the_embedding_first_and_copies_it_in_fp64(qwen7b) -> None:
    # reduce_gradients walks the flat group in module order: the embedding alone fills the first reduction
    # (the next weight would overflow the bucket); copy_grads_in_partition then takes its norm in fp64
    setup = build_setup(qwen7b, method="full", precision="bf16-mixed", gpus=4, zero=1, offload="optimizer")
    run = resolve_run(qwen7b, setup)
    assert qwen7b.embed_params == EMBED
    grads16 = 2 * run.param_plan.trainable_params
    held = 2 * BUCKET + 2 * run.param_plan.largest_trainable_tensor  # the bucket, the offload device buffer
    epilogue = memory_statics(run).wrapped.epilogue
    assert epilogue is not None
    assert (epilogue.gradients, epilogue.reduction_copy) == (grads16 - 2 * EMBED + held, 8 * EMBED)


def test_zero2_without_offload_reduces_the_last_gradient_alone(qwen7b) -> None:
    # backward order ends with the embedding, larger than the bucket: it is reduced on its own at the
    # epilogue from its own tensor, copied once (flatten) in 16 bits
    setup = build_setup(qwen7b, method="full", precision="bf16-mixed", gpus=4, zero=2)
    run = resolve_run(qwen7b, setup)
    wm = memory_statics(run).wrapped
    assert wm.epilogue is not None
    assert wm.epilogue.reduction_copy == 2 * EMBED
    assert wm.epilogue.gradients == 2 * BUCKET + wm.resident.gradients + 2 * EMBED


def test_zero1_keeps_its_bucket_through_an_accumulating_micro_batch_forward(qwen7b) -> None:
    # stage 1 reduces only at the accumulation boundary (engine.allreduce_gradients -> reduce_gradients ->
    # _release_ipg_buffers): the 5e8-element bf16 bucket of micro-batch 1's backward is still there in
    # micro-batch 2's forward and loss, and gone at the step; ZeRO-2 frees it at every micro-batch's epilogue
    def statics(zero: int, grad_accum: int):  # type: ignore[no-untyped-def]
        setup = build_setup(qwen7b, method="lora", precision="bf16-mixed", gpus=4, zero=zero,
                            grad_accum=grad_accum)
        return memory_statics(resolve_run(qwen7b, setup))

    one, two = statics(1, 1), statics(1, 2)
    assert two.earlier_grads - two.grads_prev == 2 * BUCKET
    assert one.earlier_grads - one.grads_prev == 0
    assert two.step_grads == one.step_grads
    zero2 = statics(2, 2)
    assert zero2.earlier_grads == zero2.grads_prev


def test_zero2_freeze_wider_than_the_bucket_reduces_its_first_fill_in_the_layers(qwen7b) -> None:
    # three trained layers of Qwen2.5-7B (by hand: q/k/v with biases, o, gate/up/down, two norms), their
    # gradients from the top layer down, linears last-to-first: two layers fill the 5e8-element bucket
    # and the third layer's down_proj would overflow it: it sets off the first reduction, live beside the
    # bucket and the reduction's flat copy of the two layers, before any gradient partition exists
    h, inter, kv = 3_584, 18_944, 512
    down = h * inter
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * inter + 2 * h
    setup = build_setup(qwen7b, method="freeze", precision="bf16-mixed", gpus=4, zero=2,
                        freeze_trainable_layers=3)
    epilogue = memory_statics(resolve_run(qwen7b, setup)).wrapped.epilogue
    assert epilogue is not None
    assert (epilogue.gradients, epilogue.reduction_copy) == (2 * BUCKET + 2 * down, 2 * 2 * layer)
