"""The token embedding ZeRO-3 keeps gathered through the step beside leaf MoE blocks, counted by hand from
DeepSpeed 0.19.8's ``__params_to_release`` (partitioned_param_coordinator.py: the reuse walk counts each
traced module's direct parameters; a leaf MoE block has none) and transformers 5.25's Qwen3-MoE;
estimator/wrappers/zero3_leaf_embedding.py."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_leaf_embedding import zero3_leaf_embedding_kept_bytes
from tuneplan.specs.model import model_from_config

H, V = 2048, 151936
QWEN3_MOE = dict(model_type="qwen3_moe", hidden_size=H, intermediate_size=6144, moe_intermediate_size=768,
                 num_experts=128, num_experts_per_tok=8, num_hidden_layers=2, num_attention_heads=32,
                 num_key_value_heads=4, head_dim=128, vocab_size=V, tie_word_embeddings=False)
# one layer's attention as the walk meets it: q 2048x4096, k and v 2048x512, o 4096x2048 (18,874,368)
ATTENTION = 2 * H * 4096 + 2 * H * 512


def test_the_embedding_stays_gathered_when_the_walk_only_meets_attention_and_the_head() -> None:
    spec = model_from_config(QWEN3_MOE, "qwen3-moe-2L")
    # QLoRA 4-bit under checkpointing (enable_input_require_grads gives the embedding a backward fetch):
    # 3 passes x 2 layers x (18.9e6 / 2 packed + norms) + 2 x 311e6 (head) = 6.8e8 < 1e9: the
    # 311,164,928-element embedding kept, bf16
    assert 3 * 2 * (ATTENTION // 2 + 3 * H) + 2 * V * H < 1_000_000_000
    qlora = build_setup(spec, method="qlora", precision="bf16", gpus=8, zero=3, gradient_checkpointing=True)
    assert zero3_leaf_embedding_kept_bytes(resolve_run(spec, qlora)) == V * H * 2
    # LoRA without checkpointing: the frozen embedding's output needs no gradient, no backward fetch
    lora = build_setup(spec, method="lora", precision="bf16", gpus=2, zero=3, gradient_checkpointing=False)
    assert zero3_leaf_embedding_kept_bytes(resolve_run(spec, lora)) == 0


def test_the_walk_past_the_distance_releases_the_embedding() -> None:
    # a 300,000-token head: 2 x 6.14e8 = 1.23e9 >= 1e9 on its own
    spec = model_from_config(dict(QWEN3_MOE, vocab_size=300_000), "qwen3-moe-big-vocab-2L")
    qlora = build_setup(spec, method="qlora", precision="bf16", gpus=8, zero=3, gradient_checkpointing=True)
    assert zero3_leaf_embedding_kept_bytes(resolve_run(spec, qlora)) == 0
    # a dense model of the same shape has no leaf block: its MLPs count, nothing special here
    dense = model_from_config(dict(QWEN3_MOE, model_type="qwen3"), "qwen3-dense-2L")
    dense_qlora = build_setup(dense, method="qlora", precision="bf16", gpus=8, zero=3,
                              gradient_checkpointing=True)
    assert zero3_leaf_embedding_kept_bytes(resolve_run(dense, dense_qlora)) == 0


def test_the_second_pass_gathers_down_proj_once_without_a_shared_expert() -> None:
    # Qwen3-MoE's leaf block holds the router (128 x 2048) and the fused stacks only: the router with
    # gate_up_proj [128, 1536, 2048] coalesced (buffer + copy), down_proj [128, 2048, 768] alone, fp16
    # under a QLoRA fp16 run (DeepSpeed casts the unquantized parameters): 2 (262,144 + 402,653,184)
    # + 201,326,592 elements, 2 B
    from tuneplan.estimator.wrappers.zero3_leaf_embedding import second_pass_top_round_bytes

    spec = model_from_config(QWEN3_MOE, "qwen3-moe-2L")
    qlora = build_setup(spec, method="qlora", precision="fp16", gpus=8, zero=3, gradient_checkpointing=True)
    assert second_pass_top_round_bytes(resolve_run(spec, qlora)) == (2 * (128 * H + 402_653_184)
                                                                    + 201_326_592) * 2


def test_a_shared_expert_makes_the_down_proj_round_coalesced() -> None:
    # Qwen2-MoE-like, 16 experts of f 512, h 1024, shared expert f 2048: the shared expert's gate (16-bit,
    # a router) joins down_proj's round, held twice; the shared expert's three 4-bit linears a packed round
    # of their own held twice (3 x 1024 x 2048 / 2 bytes)
    from tuneplan.estimator.wrappers.zero3_leaf_embedding import second_pass_top_round_bytes

    cfg = dict(model_type="qwen2_moe", hidden_size=1024, intermediate_size=4096, moe_intermediate_size=512,
               shared_expert_intermediate_size=2048, num_experts=16, num_experts_per_tok=2,
               num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8, vocab_size=32000,
               tie_word_embeddings=False)
    spec = model_from_config(cfg, "qwen2-moe-like-2L")
    qlora = build_setup(spec, method="qlora", precision="bf16", gpus=4, zero=3, gradient_checkpointing=True)
    router, gate_up, down = 16 * 1024 + 1024, 16 * 2 * 512 * 1024, 16 * 1024 * 512
    codes = 3 * 1024 * 2048 // 2
    assert second_pass_top_round_bytes(resolve_run(spec, qlora)) == (2 * (router + gate_up) + 2 * down) * 2 \
        + 2 * codes
