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
    # reduce_gradients walks the flat group in module order: the embedding comes first, wider than the
    # bucket, so reduce_independent_p_g_buckets_and_remove_grads leaves its gradient in its own tensor
    # (extra_large_param_to_reduce; under offload a clone replaces its data), not moved into the bucket:
    # every 16-bit gradient is still held when copy_grads_in_partition takes the embedding slice's norm in
    # fp64 (simulate: GLM-4-9B full, fp16-mixed, 2 GPUs, its 151552 x 4096 embedding alike)
    setup = build_setup(qwen7b, method="full", precision="bf16-mixed", gpus=4, zero=1, offload="optimizer")
    run = resolve_run(qwen7b, setup)
    assert qwen7b.embed_params == EMBED
    grads16 = 2 * run.param_plan.trainable_params
    held = 2 * BUCKET + 2 * run.param_plan.largest_trainable_tensor  # the bucket, the offload device buffer
    epilogue = memory_statics(run).wrapped.epilogue
    assert epilogue is not None
    assert (epilogue.gradients, epilogue.reduction_copy) == (grads16 + held, 8 * EMBED)


def test_zero2_without_offload_reduces_the_last_gradient_alone(qwen7b) -> None:
    # backward order ends with the embedding, larger than the bucket: it is reduced on its own at the
    # epilogue from its own tensor, not copied (torch's flatten of one tensor is its own view); the larger
    # moment is its arrival, which reduces what the bucket holds, the two bottom layers (2 x 233,057,792
    # elements: q, k, v with biases, o, gate/up/down, two norms), flattened into one 16-bit copy beside it
    setup = build_setup(qwen7b, method="full", precision="bf16-mixed", gpus=4, zero=2)
    run = resolve_run(qwen7b, setup)
    wm = memory_statics(run).wrapped
    assert wm.epilogue is not None
    assert wm.epilogue.reduction_copy == 2 * 2 * 233_057_792
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


# a small DeepSeek-V3 (hand config): one dense layer first, then MoE layers of 4 routed experts of width 16
# and one shared expert; no q_lora_rank (q_proj), kv_lora_rank 32, 2 heads of nope 16 + rope 8, v_head 16
MINI_DSV3 = {"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
             "num_attention_heads": 2, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
             "moe_intermediate_size": 16, "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 32,
             "q_lora_rank": None, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
             "vocab_size": 100, "tie_word_embeddings": False}


def test_full_module_order_builds_layers_in_order_with_fused_experts() -> None:
    # transformers 5 (modeling_deepseek_v3.py): layer 0 dense (layer_idx < first_k_dense_replace), layers
    # 1-2 MoE; DeepseekV3Experts holds gate_up_proj (E, 2f, h) and down_proj (E, h, f) as two parameters
    from tuneplan.estimator.wrappers.zero12_reductions import full_module_order
    from tuneplan.specs.model import model_from_config

    model = model_from_config(MINI_DSV3, "mini DeepSeek-V3 (hand config)")
    h, heads = 64, 2
    attn = [h * heads * 24, h * (32 + 8), 32 * heads * (16 + 16), heads * 16 * h]  # q, kv_a, kv_b, o
    norms = 2 * h + 32  # input / post-attention RMSNorms, kv_a_layernorm
    dense = [*attn, h * 128, h * 128, 128 * h, norms]
    moe = [*attn, h * 4, 4 * 2 * 16 * h, 4 * h * 16, h * 16, h * 16, 16 * h, norms]  # router, experts, shared
    assert full_module_order(model) == [100 * h, *dense, *moe, *moe, h, 100 * h]


def test_freeze_gradients_reach_the_bucket_in_the_trained_layers_module_order(qwen7b) -> None:
    # a freeze run's flat group holds the top two layers' parameters as Qwen2DecoderLayer registers them:
    # self_attn q, k, v (with biases), o, then mlp gate, up, down, then the two RMSNorms (one entry);
    # ZeRO-1 with offload reduces them in that order (stage_1_and_2.py reduce_gradients), so the first
    # bucket and the largest slice whose norm is taken in fp64 are known though the run is wider than it
    from tuneplan.estimator.wrappers.zero12_reductions import freeze_module_order

    h, kv, f = 3_584, 512, 18_944
    layer = [h * h + h, h * kv + kv, h * kv + kv, h * h, h * f, h * f, f * h, 2 * h]
    setup = build_setup(qwen7b, method="freeze", precision="bf16-mixed", gpus=4, zero=1, offload="optimizer")
    run = resolve_run(qwen7b, setup)
    assert freeze_module_order(run) == layer * 2
    assert sum(layer) * 2 == run.param_plan.trainable_params


def test_offload_gradient_buffer_holds_the_fused_expert_stack() -> None:
    # DeepSpeedZeroOptimizer sizes temp_grad_buffer_for_gpu_offload by its largest parameter; transformers
    # 5 registers Mixtral's experts as gate_up_proj [8, 2 x 14336, 4096] and down_proj [8, 4096, 14336],
    # so the largest is the fused gate_up stack, twice one expert projection stacked over the 8 experts
    from tuneplan.estimator.wrappers.zero12_reductions import largest_trained_param
    from tuneplan.specs.model import model_from_config

    spec = model_from_config(dict(model_type="mixtral", hidden_size=4096, num_hidden_layers=2,
                                  num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                                  vocab_size=32000, num_local_experts=8, num_experts_per_tok=2,
                                  tie_word_embeddings=False), "Mixtral-8x7B 2 layers (hand config)")
    for method in ("full", "freeze"):
        setup = build_setup(spec, method=method, precision="bf16-mixed", gpus=4, zero=1, offload="optimizer")
        assert largest_trained_param(resolve_run(spec, setup)) == 8 * 2 * 14336 * 4096, method
