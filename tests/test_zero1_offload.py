"""ZeRO-1 with offload_optimizer: reduce_gradients' walk over the flat group at the accumulation boundary
(estimator/wrappers/zero1_offload.py), by hand from DeepSpeed 0.19.8's stage_1_and_2.py."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run
from tuneplan.specs.model import model_from_config

BUCKET = 500_000_000  # reduce_bucket_size, elements


def mixtral(layers: int):  # type: ignore[no-untyped-def]
    return model_from_config(dict(model_type="mixtral", hidden_size=4096, num_hidden_layers=layers,
                                  num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                                  vocab_size=32000, num_local_experts=8, num_experts_per_tok=2,
                                  tie_word_embeddings=False), f"Mixtral-8x7B {layers} layers (hand config)")


def test_zero1_offload_reduces_a_fused_expert_stack_alone_and_copies_it_in_fp64() -> None:
    # Mixtral-8x7B at 4 layers under transformers 5, full, bf16, 2 GPUs. Module order (the flat group):
    # embedding 32000 x 4096 = 131,072,000; per layer q 16,777,216, k 4,194,304, v 4,194,304,
    # o 16,777,216, router 8 x 4096 = 32,768, gate_up_proj 8 x 28672 x 4096 = 939,524,096, down_proj
    # 8 x 4096 x 14336 = 469,762,048, two norms 8,192 (1,451,270,144 a layer); final norm 4,096; lm_head
    # 131,072,000: G = 6,067,228,672 elements, rank 0's slice the first 3,033,614,336.
    # reduce_gradients: the embedding and layer 0's attention and router (173,047,808) go into the bucket;
    # gate_up_proj would overflow it: that bucket is reduced (the embedding's fp64 norm, 1,048,576,000 B),
    # then gate_up_proj, wider than the bucket, stays in its own tensor (a clone); down_proj would
    # overflow it: gate_up_proj is reduced alone, wholly in rank 0's slice, a lone slice (no flat copy),
    # and copy_grads_in_partition copies it to fp64 for its norm: 8 x 939,524,096 = 7,516,192,768 B,
    # beside every gradient not moved into the bucket, (G - 173,047,808) x 2 = 11,788,361,728 B, the
    # 5e8-element bf16 bucket (1,000,000,000 B) and temp_grad_buffer_for_gpu_offload (the largest
    # parameter, gate_up_proj: 1,879,048,192 B). Later reductions hold less: the layers below are gone.
    spec = mixtral(4)
    setup = build_setup(spec, method="full", precision="bf16", gpus=2, zero=1, offload="optimizer",
                        batch=1, seq=384, grad_accum=2)
    run = resolve_run(spec, setup)
    assert run.param_plan.trainable_params == 6_067_228_672
    epilogue = memory_statics(run).wrapped.epilogue
    assert epilogue is not None
    assert (epilogue.gradients, epilogue.reduction_copy) == (
        11_788_361_728 + 1_000_000_000 + 1_879_048_192, 7_516_192_768)


def test_zero1_offload_keeps_an_oversized_gradient_outside_rank_0s_slice() -> None:
    # the same model at 2 layers over 4 GPUs: G = 262,144,000 + 2 x 1,451,270,144 + 4,096 = 3,164,688,384
    # elements, rank 0's slice the first 791,172,096: the embedding, layer 0's attention and router
    # (173,047,808 in all) and the first 618,124,288 elements of layer 0's gate_up_proj. Its reduction is
    # the larger moment: the fp64 copy of its overlap with the slice, 8 x 618,124,288 = 4,944,994,304 B,
    # though average_tensor copies the stack whole (two ranks' slices: 1,879,048,192 B), beside
    # (G - 173,047,808) x 2 = 5,983,281,152 B of gradients, the bucket and the offload buffer. Past it
    # rank 0 sends nothing more to the host (copy_grads_in_partition only for its slice): layer 1's
    # gate_up_proj, reduced alone later, has no norm copy here and its clone stays held.
    spec = mixtral(2)
    setup = build_setup(spec, method="full", precision="bf16", gpus=4, zero=1, offload="optimizer")
    run = resolve_run(spec, setup)
    assert run.param_plan.trainable_params == 3_164_688_384
    epilogue = memory_statics(run).wrapped.epilogue
    assert epilogue is not None
    assert (epilogue.gradients, epilogue.reduction_copy) == (
        5_983_281_152 + 1_000_000_000 + 1_879_048_192, 4_944_994_304)
