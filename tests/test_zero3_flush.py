"""ZeRO-3's first gradient reduction when the untied output head fills the IPG bucket alone
(estimator/wrappers/zero3_coordinator.py), counted by hand from DeepSpeed 0.19.8's stage3.py and
coalesced_collectives.py on an untied Llama of hidden 4096, intermediate 16384 and vocab 131072 (no GQA):
the head holds V H = 536,870,912 elements, over the 5e8-element default bucket."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.wrappers.zero3_flush import zero3_flush_scratch, zero3_gathered_at_head_flush
from tuneplan.specs.model import ModelSpec, model_from_config

H, F, V = 4096, 16384, 131072
HEAD = V * H  # 536,870,912
LAYER = 4 * H * H + 3 * H * F + 2 * H  # 268,443,648
BUCKET, PREFETCH = 500_000_000, 50_000_000


def llama(layers: int) -> ModelSpec:
    cfg = dict(model_type="llama", hidden_size=H, num_hidden_layers=layers, num_attention_heads=32,
               num_key_value_heads=32, intermediate_size=F, vocab_size=V, tie_word_embeddings=False)
    return model_from_config(cfg, f"llama-{layers}L")


def test_a_head_over_the_bucket_is_reduced_in_place_beside_its_own_gradient_and_the_fp64_norm_chunk() -> None:
    spec = llama(2)
    # ws 2: one gradient divisible by 2, reduce_scatter_coalesced reduces it in place (no copy); it was not
    # copied into the bucket (over 5e8), so its own 16-bit tensor is live: 2 V H bytes; with
    # offload_optimizer the norm takes ceil(V H / 2) = 268,435,456 > 2.5e8 elements in fp64 chunks of 2.5e8;
    # the final norm's gradient (H elements), whose hook runs the reduction, is live beside it
    off = build_setup(spec, method="full", gpus=2, zero=3, offload="optimizer")
    assert zero3_flush_scratch(spec, off, BUCKET, 2) == 2 * HEAD + 8 * 250_000_000 + 2 * H
    plain = build_setup(spec, method="full", gpus=2, zero=3)
    assert zero3_flush_scratch(spec, plain, BUCKET, 2) == 2 * HEAD + 2 * H
    # ws 3: V H = 3 x 178,956,970 + 2 is padded to 3 x 178,956,971 in the interleaved copy
    three = build_setup(spec, method="full", gpus=3, zero=3, offload="optimizer")
    assert (zero3_flush_scratch(spec, three, BUCKET, 2)
            == 2 * HEAD + 2 * 3 * 178_956_971 + 8 * 178_956_971 + 2 * H)


def test_the_first_reduction_in_the_bottom_layer_runs_beside_its_trigger_and_a_late_embedding_copy() -> None:
    # Mistral-7B (h 4096, 8 KV heads of 128, f 14336, vocab 32768, untied) at 2 layers, full with
    # checkpointing over 4 GPUs. Backward gradients: head V H = 134,217,728, final norm H, layer 1's linears
    # 218,112,000, layer 0's down and up (58,720,256 each): 469,774,336 elements, all divisible by 4 (no
    # padding), the fill the simulated reduce_scatter_coalesced concatenated (its norms later); layer 0's
    # gate_proj (58,720,256), the next, runs it from its hook with its 16-bit gradient live.
    from tuneplan.estimator.wrappers.zero3_first_pass import embedding_round_late
    from tuneplan.estimator.wrappers.zero3_flush import zero3_flush_place

    cfg = dict(model_type="mistral", hidden_size=H, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, intermediate_size=14336, vocab_size=32768,
               tie_word_embeddings=False)
    spec = model_from_config(cfg, "mistral-2L")
    setup = build_setup(spec, method="full", gpus=4, zero=3, gradient_checkpointing=True, precision="bf16")
    assert zero3_flush_scratch(spec, setup, BUCKET, 2) == 2 * 469_774_336 + 2 * 58_720_256
    # the flush is in layer 0 (one layer above it), run from gate_proj's hook once its gradient is made:
    # the MLP block back-propagated, its saved tensors released (simulate: Mistral-7B-v0.2, 2 layers, full
    # over 8 GPUs, 1 x 128: no 14336-wide tensor of layer 0 beside the first reduction's norm)
    assert zero3_flush_place(spec, setup, BUCKET) == (1, True)
    # the forward trace's 5e7 rounds: [E], [q k v o gate], [up], [down] per layer, [head]: 8; the embedding's
    # backward round is popped at fetch 9, after layer 0's q_proj (fetch 7: two wrappers, the embedding,
    # the layer, its norm, its attention, q_proj) was released: late, its copy made at layer 0's recompute
    assert embedding_round_late(spec, setup, PREFETCH) == 32768 * H
    # without checkpointing the released linears are fetched again only at the end of the layer's backward
    plain = build_setup(spec, method="full", gpus=4, zero=3, gradient_checkpointing=False, precision="bf16")
    assert embedding_round_late(spec, plain, PREFETCH) == 0


def test_a_freeze_runs_trained_layers_fill_the_bucket_below_the_top() -> None:
    # Mistral-Nemo (h 5120, 32 heads and 8 KV heads of 128, f 14336) at 4 layers, the top 2 trained, over 2
    # GPUs: per layer q and o 20,971,520, k and v 5,242,880, gate/up/down 73,400,320, norms 2 h. Layer 3
    # (272,640,000) and layer 2's down, up and gate fill the bucket: 492,840,960 (the simulated first
    # reduction 492,846,080: one norm earlier); layer 2's o_proj (20,971,520) runs it. One layer above,
    # its MLP block back-propagated.
    from tuneplan.estimator.wrappers.zero3_flush import zero3_bucket_flush, zero3_flush_place

    cfg = dict(model_type="mistral", hidden_size=5120, num_hidden_layers=4, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, intermediate_size=14336, vocab_size=131072,
               tie_word_embeddings=False)
    spec = model_from_config(cfg, "nemo-4L")
    setup = build_setup(spec, method="freeze", gpus=2, zero=3, gradient_checkpointing=True)
    assert abs(zero3_bucket_flush(spec, setup, BUCKET) - 492_846_080) <= 5120
    assert zero3_flush_scratch(spec, setup, BUCKET, 2) == 2 * 492_840_960 + 2 * 20_971_520
    assert zero3_flush_place(spec, setup, BUCKET) == (1, True)


def test_at_the_heads_reduction_one_prefetch_round_follows_the_heads_release() -> None:
    # 4 layers: at the loss the coordinator holds 1e9 + H F (a layer parameter crosses), the head among
    # them; freed after its backward, HEAD less; the final norm's fetch pops one round: 5e7 elements, the
    # last parameter (at most H F) overshooting
    spec = llama(4)
    setup = build_setup(spec, method="full", gpus=2, zero=3)
    held = 1_000_000_000 + H * F - HEAD
    assert zero3_gathered_at_head_flush(spec, setup, PREFETCH, BUCKET) == held + PREFETCH + H * F
    # 2 layers: what is left before the embedding (2 LAYER + H - held = 6,653,440) is under one round, so
    # the round pops the embedding too: every parameter after the head is gathered
    spec2 = llama(2)
    setup2 = build_setup(spec2, method="full", gpus=2, zero=3)
    assert zero3_gathered_at_head_flush(spec2, setup2, PREFETCH, BUCKET) == H + 2 * LAYER + HEAD
    # a head under the bucket shares its fill with the next gradients: not this reduction
    assert zero3_gathered_at_head_flush(spec2, setup2, PREFETCH, 2 * HEAD) == -1


def test_a_head_over_the_reuse_distance_is_gathered_beside_the_top_layer_in_its_forward() -> None:
    # vocab 262144 x 4096 = 1,073,741,824 >= stage3_max_reuse_distance (1e9): no layer is kept from its
    # forward to its backward, and the head is popped at the top layer's first fetch, beside that layer
    from tuneplan.estimator.wrappers.zero3_coordinator import zero3_gathered_at_top_forward

    cfg = dict(model_type="llama", hidden_size=H, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=32, intermediate_size=F, vocab_size=262144, tie_word_embeddings=False)
    spec = model_from_config(cfg, "llama-big-head")
    setup = build_setup(spec, method="lora", gpus=8, zero=3)
    assert zero3_gathered_at_top_forward(spec, setup) == LAYER + 262144 * H
    # a head under the distance (V H = 536,870,912): the layers above it are kept, no such instant
    assert zero3_gathered_at_top_forward(llama(2), build_setup(llama(2), method="lora", gpus=8, zero=3)) == 0


def test_a_leaf_moe_blocks_gradients_are_all_live_when_its_first_one_triggers_the_reduction() -> None:
    # Qwen3-MoE (h 2048, 32 heads and 4 KV heads of 128, 128 experts of f 768, vocab 151936, untied) at 2
    # layers, full fp16 over 8 GPUs with offload_optimizer. DeepSpeed 0.19.8 makes Qwen3MoeSparseMoeBlock a
    # ZeRO-3 leaf module (leaf_module_config.py DEFAULT_LEAF_MODULE_CLASSES): its parameters are reduced by
    # one backward hook on the block, in registration order (experts.gate_up_proj 128 x 1536 x 2048 =
    # 402,653,184, experts.down_proj 128 x 2048 x 768 = 201,326,592, gate.weight 128 x 2048 = 262,144), all
    # three gradients made by then. The head (151936 x 2048 = 311,164,928) and the final norm (2048) fill the
    # bucket; gate_up (over the 5e8 with them) runs the reduction: the interleaved copy of the two
    # (311,164,928 / 8 = 38,895,616 and 2048 / 8 = 256 per rank, no padding: 311,166,976 elements), the fp64
    # chunk of the head's partition (38,895,616), the block's three 16-bit gradients.
    cfg = dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=4, head_dim=128, moe_intermediate_size=768, intermediate_size=6144,
               num_experts=128, num_experts_per_tok=8, vocab_size=151936, tie_word_embeddings=False)
    spec = model_from_config(cfg, "qwen3-moe-2L")
    setup = build_setup(spec, method="full", gpus=8, zero=3, offload="optimizer", precision="fp16")
    block = 402_653_184 + 201_326_592 + 262_144
    assert zero3_flush_scratch(spec, setup, BUCKET, 2) == 2 * 311_166_976 + 8 * 38_895_616 + 2 * block


def test_full_epilogue_reduces_the_last_fill_beside_the_gathered_embedding() -> None:
    # the tiny untied Llama (h 64, f 128, kv 2 x 16, vocab 256, 2 layers), full, 4 ranks, CPU optimizer.
    # Its backward's gradients: head 16,384, final norm 64, per layer q 4,096, k 2,048, v 2,048, o 4,096,
    # gate / up / down 8,192 each, two norms 64 each, the embedding 16,384: 106,816 elements, all in one
    # 5e8 bucket. The epilogue's reduce_scatter_coalesced copy: every gradient divisible by 4, 106,816
    # bf16 elements = 213,632 bytes; the fp64 norm chunk of the largest partition (16,384 / 4) = 32,768
    # bytes; the embedding still gathered, 16,384 x 2 = 32,768 bytes.
    from tuneplan.estimator.wrappers.base import Epilogue
    from tuneplan.estimator.wrappers.zero3_flush import zero3_epilogue

    from .sharded_tiny import TINY

    spec = model_from_config(TINY, "tiny-llama-epilogue")
    setup = build_setup(spec, method="full", gpus=4, zero=3, offload="optimizer")
    assert zero3_epilogue(spec, setup, 500_000_000, 2, 1_000) == Epilogue(1_000, 213_632 + 32_768, 32_768)
    # a 16,384-element bucket: the embedding's gradient alone in the last fill, divisible by 4: reduced
    # in place, no copy, the norm's chunk 32,768 bytes. Before it, its hook reduced the fill it did not
    # fit beside, layer 0's q_proj and norms [4,096, 128]: copy (4,096 + 128) x 2 = 8,448 bytes, the norm's
    # chunk 8 x 4,096 / 4 = 8,192, the embedding's gradient 32,768 beside them: 49,408, the larger moment
    assert zero3_epilogue(spec, setup, 16_384, 2, 1_000) == Epilogue(1_000, 49_408, 32_768)
    # LoRA: no epilogue row of its own
    lora = build_setup(spec, method="lora", gpus=4, zero=3)
    assert zero3_epilogue(spec, lora, 500_000_000, 2, 1_000) is None


def test_the_reduction_run_by_the_mlps_last_gradient_comes_past_the_mlp() -> None:
    # Pythia-6.9B (GPT-NeoX: h 4096, f 16384, vocab 50432, untied, biases) at 3 layers, full over 2 GPUs.
    # Backward gradients (their hooks' order): embed_out 50432 x 4096 = 206,569,472, the final norm 8,192,
    # layer 2: dense_4h_to_h 67,112,960, dense_h_to_4h 67,125,248, dense 16,781,312, query_key_value
    # 50,343,936, two norms 16,384; layer 1's dense_4h_to_h: 475,070,464 in all (the simulated
    # reduce_scatter_coalesced copy), dense_h_to_4h's 67,125,248 would pass 5e8: its hook runs the
    # reduction once the MLP's last linear is back-propagated (stage3.py
    # reduce_independent_p_g_buckets_and_remove_grads): one layer above, past the MLP
    from tuneplan.estimator.wrappers.zero3_flush import zero3_bucket_flush, zero3_flush_place

    cfg = dict(model_type="gpt_neox", hidden_size=4096, num_hidden_layers=3, num_attention_heads=32,
               intermediate_size=16384, vocab_size=50432, tie_word_embeddings=False,
               use_parallel_residual=True, rotary_pct=0.25)
    spec = model_from_config(cfg, "pythia-3L")
    setup = build_setup(spec, method="full", gpus=2, zero=3, gradient_checkpointing=True, precision="bf16")
    assert zero3_bucket_flush(spec, setup, BUCKET) == 475_070_464
    assert zero3_flush_place(spec, setup, BUCKET) == (1, True)


def test_past_the_mlp_the_reductions_layer_holds_two_hidden_wide_gradients() -> None:
    # the Pythia-3L reduction above, at 3 x 512 tokens in bf16: the MLP's 16384-wide gradients are gone;
    # live are the layer output's incoming gradient (autograd's input buffer, for the residual sum) and
    # dense_h_to_4h's input gradient: 2 x 1536 x 4096 x 2 B = 25,165,824 B (simulate: the two bf16
    # 1536 x 4096 tensors beside the reduction's norm); a SwiGLU MLP has two readers of its input (gate,
    # up): 3 x 128 x 4096 x 2 B for Mistral-7B-like at 1 x 128
    from tuneplan.estimator.instants import memory_at
    from tuneplan.estimator.run import resolve_run

    cfg = dict(model_type="gpt_neox", hidden_size=4096, num_hidden_layers=3, num_attention_heads=32,
               intermediate_size=16384, vocab_size=50432, tie_word_embeddings=False,
               use_parallel_residual=True, rotary_pct=0.25)
    spec = model_from_config(cfg, "pythia-3L")
    setup = build_setup(spec, method="full", gpus=2, zero=3, gradient_checkpointing=True, precision="bf16",
                        offload="all", batch=3, seq=512)
    row = memory_at(resolve_run(spec, setup), 3, 512).components("backward_flush")
    assert row["backward_temp"] == 2 * 1536 * 4096 * 2
    mistral = model_from_config(dict(model_type="mistral", hidden_size=H, num_hidden_layers=2,
                                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                     intermediate_size=14336, vocab_size=32768, tie_word_embeddings=False),
                                "mistral-2L")
    m_setup = build_setup(mistral, method="full", gpus=8, zero=3, gradient_checkpointing=True,
                          precision="bf16", offload="optimizer", batch=1, seq=128)
    m_row = memory_at(resolve_run(mistral, m_setup), 1, 128).components("backward_flush")
    assert m_row["backward_temp"] == 3 * 128 * H * 2


def test_an_embedding_gradient_that_does_not_fit_reduces_the_fill_before_it_at_its_own_hook() -> None:
    # Llama-2-7B (h 4096, f 11008, vocab 32000, untied) at 2 layers as a 1-label classifier in fp32 over 4
    # GPUs, CPU optimizer. Backward gradients: score 4096, final norm 4096, per layer q k v o 16,777,216
    # each, gate up down 45,088,768 each, norms 8,192 (202,383,360): 404,774,912 in all, then the embedding
    # 32000 x 4096 = 131,072,000, which would pass 5e8: its hook reduces the 404,774,912 (all divisible by
    # 4, no padding) beside its own gradient: copy 4 x 404,774,912 = 1,619,099,648 B, the fp64 chunk of the
    # largest partition 8 x 45,088,768 / 4 = 90,177,536 B, the embedding's gradient 4 x 131,072,000 =
    # 524,288,000 B: 2,233,565,184 B (simulate: the same three tensors beside the epilogue-time norm)
    from tuneplan.estimator.run import resolve_run
    from tuneplan.estimator.wrappers.zero3_flush import zero3_epilogue

    cfg = dict(model_type="llama", hidden_size=H, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=32, intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False)
    spec = model_from_config(cfg, "llama2-7b-2L")
    setup = build_setup(spec, method="full", gpus=4, zero=3, precision="fp32", offload="optimizer",
                        num_labels=1, batch=1, seq=64)
    epilogue = zero3_epilogue(resolve_run(spec, setup).model, setup, BUCKET, 4, 0)
    assert epilogue is not None
    assert epilogue.reduction_copy == 2_233_565_184


def test_a_partition_over_5e8_elements_is_held_as_its_fp32_cast_after_the_fp64_norm_chunks() -> None:
    # an untied Llama of hidden 4096 and vocab 262144: the head holds V H = 1,073,741,824 elements, over the
    # bucket, reduced alone in place over 2 GPUs (divisible by 2: no interleaved copy) beside its own 16-bit
    # gradient and the final norm's (H). With offload_optimizer, _offload_grad_partition_at_boundary takes
    # the norm of its ceil(V H / 2) = 536,870,912-element partition in fp64 chunks of 2.5e8 (8 x 2.5e8 =
    # 2,000,000,000 bytes at once, each freed before the next), then casts the whole partition to fp32 for
    # the CPU optimizer's gradient: 4 x 536,870,912 = 2,147,483,648 bytes, the larger of the two
    from tuneplan.estimator.wrappers.zero3_flush import offload_boundary_scratch

    big = 262144 * H
    cfg = dict(model_type="llama", hidden_size=H, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=32, intermediate_size=F, vocab_size=262144, tie_word_embeddings=False)
    spec = model_from_config(cfg, "llama-wide-vocab")
    off = build_setup(spec, method="full", gpus=2, zero=3, offload="optimizer")
    assert zero3_flush_scratch(spec, off, BUCKET, 2) == 2 * big + 4 * 536_870_912 + 2 * H
    # fp32 gradients need no cast (``.to`` returns the tensor itself): the fp64 chunk alone
    fp32 = build_setup(spec, method="full", gpus=2, zero=3, offload="optimizer", precision="fp32")
    assert zero3_flush_scratch(spec, fp32, BUCKET, 4) == 4 * big + 8 * 250_000_000 + 4 * H
    # below 5e8 elements the chunk stays the larger: 4.9e8 -> max(2e9, 1.96e9); none without the CPU optimizer
    assert offload_boundary_scratch(off, 490_000_000, 2) == 2_000_000_000
    assert offload_boundary_scratch(off, 100, 2) == 800
    assert offload_boundary_scratch(build_setup(spec, method="full", gpus=2, zero=3), 536_870_912, 2) == 0


def test_a_classifier_run_releases_its_embedding_after_the_forward_and_pops_its_round_late() -> None:
    # gemma-7b (h 3072, 16 heads of 256, f 24576, vocab 256000) at 2 layers with a 1-label score head,
    # freeze of both layers with checkpointing over 2 GPUs (LLaMA-Factory). E = 256000 x 3072 =
    # 786,432,000; per layer q, k, v, o 12,582,912, gate, up, down 75,497,472 (276,824,064 with no norms);
    # the head 3072. The embedding's backward use (enable_input_require_grads) lies 3 x 553,663,488 + 2 x
    # 3072 > 1e9 elements down the trace (forward, recompute, backward of both layers): released after its
    # forward. The forward trace's 5e7 rounds, the embedding off n_available after the root's, the model's
    # and its own fetch: [E], [q k v o], [gate], [up], [down] per layer, [head]: 10 (counted against the
    # 1e9 limit with E kept, they would stop after 5: 1.0627e9). The embedding's round is popped at fetch
    # 11; layer 0's q_proj is fetch 8 (two wrappers, the embedding, rotary_emb, the layer, its norm, its
    # attention, q_proj), released by then: late (simulate: seed 97 r244, the 8.116e8-element round of
    # layer 0's q and k and the embedding popped at its v_proj, the embedding's copy made at the recompute)
    from tuneplan.estimator.wrappers.zero3_first_pass import (
        embedding_released_after_forward,
        embedding_round_late,
    )
    from tuneplan.specs.profiles import model_as_built

    cfg = dict(model_type="gemma", hidden_size=3072, num_hidden_layers=2, num_attention_heads=16,
               num_key_value_heads=16, head_dim=256, intermediate_size=24576, vocab_size=256000,
               tie_word_embeddings=True)
    spec = model_from_config(cfg, "gemma-2L")
    setup = build_setup(spec, method="freeze", gpus=2, zero=3, gradient_checkpointing=True, num_labels=1,
                        framework="llamafactory", offload="optimizer")
    built = model_as_built(spec, "llamafactory", 1)
    assert embedding_released_after_forward(built, setup)
    assert embedding_round_late(built, setup, PREFETCH) == 786_432_000
    # the LM head tied to the embedding uses its weight right after the layers: kept, never regathered
    lm = build_setup(spec, method="freeze", gpus=2, zero=3, gradient_checkpointing=True,
                     framework="llamafactory")
    assert not embedding_released_after_forward(model_as_built(spec, "llamafactory"), lm)


def test_the_first_flush_is_kept_per_model_and_kind_not_per_batch_shape() -> None:
    from tuneplan.estimator.wrappers.zero3_flush import first_flush, zero3_bucket_flush

    # the first reduction reads the model, the kind of backward and the bucket, never the batch shape: the
    # untied head (536,870,912 elements) over a 5e8 bucket is reduced alone, for any batch
    spec = llama(2)
    one = build_setup(spec, method="full", gpus=4, zero=3, batch=1, seq=512)
    assert zero3_bucket_flush(spec, one, 500_000_000) == HEAD
    hits = first_flush.cache_info().hits
    other = build_setup(spec, method="full", gpus=4, zero=3, batch=8, seq=4096)
    assert zero3_bucket_flush(spec, other, 500_000_000) == HEAD
    assert first_flush.cache_info().hits == hits + 1
