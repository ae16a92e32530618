"""ZeRO-3 with 4-bit layers, counted by hand from DeepSpeed 0.19.8 (a bitsandbytes ``Params4bit`` is
partitioned and gathered as its packed ``uint8`` codes, ``bits / 8`` an element) and transformers 5.25's
Llama and Phi-3 layers (estimator/wrappers/zero3_quantized.py)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_quantized import zero3_kept_bytes, zero3_quantized_at_embedding_bytes
from tuneplan.specs.model import ModelSpec, model_from_config


def test_the_kept_layers_are_their_packed_bytes_less_the_bottom_layers_unused_linears() -> None:
    h, f, v = 5120, 13824, 32000
    cfg = dict(model_type="llama", hidden_size=h, intermediate_size=f, num_hidden_layers=2,
               num_attention_heads=40, num_key_value_heads=40, vocab_size=v)
    spec = model_from_config(cfg, "llama-13b-2L")
    setup = build_setup(spec, method="qlora", precision="fp32", gpus=2, zero=3, targets="mlp",
                        gradient_checkpointing=False)
    run = resolve_run(spec, setup)
    layer = 4 * h * h + 3 * h * f  # 317,194,240 weights, 158,597,120 packed nf4 bytes
    # stage3_max_reuse_distance 1e9: after the top layer's forward the head (v h = 1.6384e8) comes before
    # its backward, after the bottom one's also the top layer twice: 1.6384e8 + 2 x 3.17e8 < 1e9, both kept
    # the bottom layer's q, k, v, o (nothing below them requires grad) and gate / up (their LoRA output
    # does, their base weight's input does not) have no backward use: released after their forward
    free = 4 * h * h + 2 * h * f
    assert zero3_kept_bytes(run, v * h) == 2 * layer // 2 - free // 2  # 194,068,480
    # 16-bit layers: their elements (weights and the two norms, as zero3_kept_params counts a layer) in
    # the compute dtype
    lora = build_setup(spec, method="lora", precision="fp32", gpus=2, zero=3, targets="mlp",
                       gradient_checkpointing=True)
    assert zero3_kept_bytes(resolve_run(spec, lora), v * h) == 2 * (layer + 2 * h) * 4


def test_the_embedding_forward_holds_the_first_rounds_of_a_packed_trace() -> None:
    h, f, v = 3072, 8192, 32064
    cfg = dict(model_type="phi3", hidden_size=h, intermediate_size=f, num_hidden_layers=2,
               num_attention_heads=32, num_key_value_heads=32, vocab_size=v, tie_word_embeddings=False)
    spec = model_from_config(cfg, "phi3-mini-2L")
    setup = build_setup(spec, method="qlora", precision="fp32", gpus=2, zero=3)
    run = resolve_run(spec, setup)
    # the packed trace: embedding 9.85e7, per layer qkv 1.4156e7, o 4.719e6, gate_up 2.5166e7 (4.404e7
    # < the 5e7 prefetch bucket) and down 1.2583e7 (one round of 5.662e7), the head 9.85e7: the
    # embedding's fetch and the four wrappers' above it pop every round (the backward part of the queue
    # is AVAILABLE by then, popped uncounted): embedding and head in fp32, the layers' codes one byte each
    packed_layer = (h * 3 * h + h * h + h * 2 * f + f * h) // 2
    assert packed_layer == 56_623_104
    assert zero3_quantized_at_embedding_bytes(run, 50_000_000) == 2 * v * h * 4 + 2 * packed_layer


def test_the_first_complete_pass_holds_the_untied_head_twice_at_the_final_norm() -> None:
    # the record pass released the final norm (h = 5120 elements, under stage3_param_persistence_threshold
    # 1e5, persistent afterwards); the norm starts the coalesced [norm, head] round: its flat buffer and the
    # head's copy, in fp32 (a QLoRA fp32 run: the head is not quantized), one head beyond the loss's
    from tuneplan.estimator.wrappers.zero3_quantized import zero3_quantized_head_copy_bytes

    h, v = 5120, 152064
    cfg = dict(model_type="qwen2", hidden_size=h, intermediate_size=27648, num_hidden_layers=3,
               num_attention_heads=40, num_key_value_heads=8, vocab_size=v, tie_word_embeddings=False)
    spec = model_from_config(cfg, "qwen2.5-32b-3L")
    # with gradient accumulation: the first complete pass is the first step's second micro-batch
    setup = build_setup(spec, method="qlora", precision="fp32", gpus=2, zero=3, grad_accum=2)
    assert zero3_quantized_head_copy_bytes(resolve_run(spec, setup), 50_000_000) == (v * h + h) * 4
    tied = model_from_config(dict(cfg, tie_word_embeddings=True), "qwen2.5-32b-tied-3L")
    assert zero3_quantized_head_copy_bytes(resolve_run(tied, build_setup(tied, method="qlora",
                                                                         precision="fp32", gpus=2,
                                                                         zero=3, grad_accum=2)),
                                           50_000_000) == 0


def _llama(h: int, f: int, v: int, layers: int, name: str) -> ModelSpec:
    return model_from_config(dict(model_type="llama", hidden_size=h, intermediate_size=f,
                                  num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
                                  vocab_size=v, tie_word_embeddings=False), name)


def test_one_micro_batch_a_step_gathers_the_head_alone_after_a_round_ending_at_the_top_down_proj() -> None:
    # Without accumulation the first complete pass is the second step's: _post_step gathered the persistent
    # parameters (<= 1e5 elements) again, the prefetcher skips them. Llama-3-8B shapes, rank 16 on every
    # linear: packed nf4 q 8,388,608, k / v 2,097,152, o 8,388,608, gate / up / down 29,360,128; LoRA
    # matrices past 1e5: gate / up lora_B and down lora_A, 16 x 14336 = 229,376 each (down's lora_A is
    # fetched before its base weight). Rounds of the 5e7 bucket: [embedding], then per layer
    # [q k v o gate] = 50,331,648 and [gate_B up up_B down_A down] = 59,408,384, so the top layer's last
    # round ends at down_proj and the head, 128,256 x 4,096, is a round of its own: gathered alone, no copy
    from tuneplan.estimator.wrappers.zero3_quantized import (
        head_round_members,
        zero3_quantized_head_copy_bytes,
    )

    spec = _llama(4096, 14336, 128256, 4, "llama3-8b-4L")
    setup = build_setup(spec, method="qlora", precision="fp16-mixed", gpus=4, zero=3, rank=16,
                        targets="all-linear", gradient_checkpointing=True)
    run = resolve_run(spec, setup)
    assert head_round_members(run, 50_000_000) == []
    assert zero3_quantized_head_copy_bytes(run, 50_000_000) == 0


def test_one_micro_batch_a_step_coalesces_the_head_with_the_top_down_proj() -> None:
    # Qwen3-8B shapes over 3 layers, rank 4 on q / v (every LoRA matrix persistent): packed q 8,388,608,
    # k / v 2,097,152, o 8,388,608, gate / up / down 25,165,824. Rounds of the 5e7 bucket: [embedding],
    # [q k v o gate up] 71.3e6, [down q k v o gate] 71.3e6, [up down] 50.3e6, [q k v o gate up] 71.3e6,
    # then [down, head]: two parameters, coalesced: the head's fp32 copy (151,936 x 4,096 x 4 bytes)
    # and the flat buffer of down's codes (one byte each) beside their copies
    from tuneplan.estimator.wrappers.zero3_quantized import (
        head_round_members,
        zero3_quantized_head_copy_bytes,
    )

    spec = _llama(4096, 12288, 151936, 3, "qwen3-8b-3L")
    setup = build_setup(spec, method="qlora", precision="fp32", gpus=2, zero=3, rank=4,
                        targets="q_proj,v_proj", gradient_checkpointing=True)
    run = resolve_run(spec, setup)
    assert head_round_members(run, 50_000_000) == [(4096 * 12288 // 2, 1)]
    assert zero3_quantized_head_copy_bytes(run, 50_000_000) == 151936 * 4096 * 4 + 25_165_824


def test_a_tied_embedding_over_max_live_stops_the_prefetcher_on_the_packed_trace() -> None:
    # bloomz-7b1: the tied embedding, 250,880 x 4,096 = 1.0276e9 elements, reaches
    # stage3_max_live_parameters (1e9) alone and, its head's forward coming after the layers' 3 x 1.006e8
    # packed elements (< stage3_max_reuse_distance), is never released: the prefetcher takes nothing
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.wrappers.zero3_quantized import zero3_quantized_ahead_bytes

    base = resolve_model("bigscience/bloomz-7b1", allow_network=False)
    spec = model_from_config(dict(base.config, n_layer=3), "bloomz-3L")
    assert spec.embed_params == 250_880 * 4096 and not spec.lm_head_params
    setup = build_setup(spec, method="qlora", precision="fp32", gpus=4, zero=3, targets="attn",
                        gradient_checkpointing=True)
    assert zero3_quantized_ahead_bytes(spec, setup, 50_000_000, 4) == 0


def test_the_reuse_distance_counts_the_packed_layers() -> None:
    # Llama-2-7b, 32 layers, QLoRA with checkpointing: a layer is 4 x 4096^2 + 3 x 4096 x 11008 =
    # 202,375,168 weights, 101,187,584 packed elements; with the untied head (32000 x 4096 = 1.31072e8)
    # stage3_max_reuse_distance (1e9) leaves 8.68928e8 for 2 k layers: k = ceil(4.29) = 5 kept layers
    # (on unpacked elements it would be 3)
    h, f, v = 4096, 11008, 32000
    cfg = dict(model_type="llama", hidden_size=h, intermediate_size=f, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=32, vocab_size=v)
    spec = model_from_config(cfg, "llama-2-7b")
    setup = build_setup(spec, method="qlora", precision="bf16", gpus=8, zero=3, gradient_checkpointing=True)
    packed = (4 * h * h + 3 * h * f) // 2
    assert zero3_kept_bytes(resolve_run(spec, setup), v * h) == 5 * packed


def test_past_max_live_the_prefetcher_stops_at_m_plus_the_crossing_packed_weight() -> None:
    # Llama-2-13b, 8 layers, QLoRA nf4 in bf16: head 32000 x 5120 = 1.6384e8 elements (bf16) and
    # 8 x 1.586e8 packed layer elements reach stage3_max_live_parameters (1e9): the prefetcher holds M
    # elements, the head among them, the rest packed bytes, plus the parameter that crosses, at most an MLP
    # weight's 5120 x 13824 / 2 = 35,389,440 codes
    from tuneplan.estimator.wrappers.zero3_quantized import zero3_quantized_ahead_bytes

    h, f, v = 5120, 13824, 32000
    cfg = dict(model_type="llama", hidden_size=h, intermediate_size=f, num_hidden_layers=8,
               num_attention_heads=40, num_key_value_heads=40, vocab_size=v)
    spec = model_from_config(cfg, "llama-13b-8L")
    for ckpt in (True, False):
        setup = build_setup(spec, method="qlora", precision="bf16", gpus=2, zero=3, targets="q_proj,v_proj",
                            gradient_checkpointing=ckpt)
        assert zero3_quantized_ahead_bytes(spec, setup, 50_000_000, 2) == (
            v * h * 2 + 1_000_000_000 - v * h + h * f // 2)


def test_an_embedding_round_popped_after_the_first_linear_is_held_twice_in_the_bottom_layer() -> None:
    # gemma-7b over 4 layers, QLoRA nf4 rank 32 on the MLP with checkpointing and a 2-label head: packed
    # q / k / v / o 6,291,456, gate / up / down 37,748,736; LoRA matrices past 1e5: gate / up lora_B and
    # down lora_A, 24,576 x 32 = 786,432 (the classifier head is persistent). Rounds of the 5e7 bucket:
    # [embedding 7.8643e8], [q k v o gate] 62.9e6, [gate_B up up_B down_A down] 77.9e6, [q k v o gate],
    # then 9.9e6 left under stage3_max_live_parameters: [gate_B up]; the embedding released after its
    # forward, [up_B down_A down q k] 51.9e6, [v o gate], [gate_B ... down], [q k v o gate],
    # [gate_B ... down]: ten rounds, the embedding's backward use the eleventh, popped at the eleventh
    # fetch: PeftModel, LoraModel, the classification model, the base model, the embedding, the rotary
    # module, layer 0, its input norm, its attention, q_proj (fetch 10, released after its forward),
    # k_proj. Held in layer 0's backward: the layer's codes, the flat buffer and the embedding's copy.
    # The coordinator replayed (zero3_module_trace.py) places the round [k_proj, embedding] and its wait
    # at layer 0's recomputed k_proj: the layer's codes 4 x 6,291,456 + 3 x 37,748,736 (k's copy among
    # them), its three LoRA matrices past 1e5 in 16 bits 3 x 786,432 x 2, the flat buffer (k's codes and
    # the embedding, 6,291,456 + 786,432,000 x 2) and the embedding's copy 786,432,000 x 2
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.wrappers.zero3_quantized_embedding import zero3_quantized_embedding_round

    base = resolve_model("google/gemma-7b", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=4), "gemma-7b-4L")
    setup = build_setup(spec, method="qlora", precision="bf16-mixed", gpus=4, zero=3, rank=32,
                        targets="mlp", gradient_checkpointing=True, num_labels=2)
    run = resolve_run(spec, setup)
    assert run.dtypes.non_block == 2 and spec.embed_params == 256_000 * 3072
    layer = 4 * 6_291_456 + 3 * 37_748_736
    assert zero3_quantized_embedding_round(run, 50_000_000) == (
        0, layer + 3 * 786_432 * 2 + 6_291_456 + 2 * 786_432_000 * 2)


def test_an_embedding_round_joining_the_forwards_last_round_keeps_a_copy_from_the_top_layer() -> None:
    # phi-4 over 4 layers, QLoRA fp4 rank 32 on the MLP with checkpointing and a 2-label head (persistent):
    # packed qkv 19,660,800, o 13,107,200, gate_up 91,750,400, down 45,875,200; LoRA matrices past 1e5:
    # gate_up lora_A 163,840 and lora_B 1,146,880, down lora_A 573,440 and lora_B 163,840. Rounds of the
    # 5e7 bucket: [embedding 5.138e8], [qkv o gu_A gu] 124.7e6, [gu_B d_A down d_B qkv] 67.4e6, [o gu_A gu]
    # 105.0e6, ... and layer 3's [gu_B d_A down d_B] 47.76e6 < 5e7: the embedding's backward use joins it,
    # the ninth round, before the first linear's (qkv_proj's) tenth fetch: coalesced, the embedding's fp16
    # copy made at layer 3's gate_up lora_B and held beside its flat buffer through the backward.
    # The coordinator replayed (zero3_module_trace.py) holds both in what it gathers at the loss: the four
    # layers' codes 4 x 170,393,600 and LoRA matrices 4 x 2,048,000 x 2 bytes (kept from their forward),
    # the embedding's copy 513,802,240 x 2 and the round's flat buffer, (1,146,880 + 573,440 + 163,840)
    # x 2 + 45,875,200 + 513,802,240 x 2 = 1,077,248,000
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.wrappers.zero3_quantized_embedding import zero3_quantized_embedding_round

    base = resolve_model("microsoft/phi-4", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=4), "phi-4-4L")
    setup = build_setup(spec, method="qlora", precision="fp16", gpus=4, zero=3, rank=32, targets="mlp",
                        gradient_checkpointing=True, num_labels=2, quant_type="fp4")
    run = resolve_run(spec, setup)
    assert run.dtypes.non_block == 2 and spec.embed_params == 100_352 * 5120
    from tuneplan.estimator.wrappers.zero3_module_trace import zero3_replayed_gathered

    replayed = zero3_replayed_gathered(run, 50_000_000)
    assert replayed is not None and zero3_quantized_embedding_round(run, 50_000_000)[0] == 0
    assert replayed.at_loss == 4 * 170_393_600 + 4 * 2_048_000 * 2 + 100_352 * 5120 * 2 + 1_077_248_000


def test_a_leaf_moe_block_keeps_the_norms_round_without_accumulation() -> None:
    # Qwen3-MoE's sparse block is a ZeRO-3 leaf (fetched whole, its fused stacks one parameter each), which
    # the per-expert queue of the second step does not describe: the head's round stays [final norm, head]
    # as in the first complete pass, its flat buffer and the head's copy in fp32 (a QLoRA fp32 run)
    from tuneplan.estimator.wrappers.zero3_quantized import zero3_quantized_head_copy_bytes

    h, v = 2048, 151936
    cfg = dict(model_type="qwen3_moe", hidden_size=h, intermediate_size=6144, moe_intermediate_size=768,
               num_experts=128, num_experts_per_tok=8, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=4, head_dim=128, vocab_size=v, tie_word_embeddings=False)
    spec = model_from_config(cfg, "qwen3-30b-a3b-2L")
    setup = build_setup(spec, method="qlora", precision="fp32", gpus=8, zero=3, grad_accum=1)
    assert zero3_quantized_head_copy_bytes(resolve_run(spec, setup), 50_000_000) == (v * h + h) * 4


def test_past_max_live_the_prefetcher_resumes_and_coalesces_the_head_with_the_top_down_lora_b() -> None:
    # Llama-3.1-405B shapes over 2 layers, QLoRA nf4 rank 8 on every linear in fp16: the embedding,
    # 128,256 x 16,384 = 2,101,346,304 elements, is the first round, past stage3_max_live_parameters (1e9):
    # the next fetches pop nothing (fetch_sub_module: min(M - A, bucket) <= 0). Its forward releases it
    # (its backward use lies past the reuse distance), the layers' modules gather their own entries, use
    # and release them (each packed weight, 16,384 x 53,248 / 2 = 436,207,616 for the MLP, is used again
    # only in the backward, beyond 1e9): the prefetcher resumes and runs ahead, a packed weight past the
    # 5e7 bucket ending each round. The top layer's last round ends at down_proj's codes; down_proj's
    # lora_B (16,384 x 8 = 131,072, past the persistence threshold 1e5) starts the next, under the bucket:
    # the head joins it. Coalesced: the flat buffer (131,072 + 2,101,346,304 fp16 elements, as the
    # simulation allocates it at layer 1's gate_proj) and the head's copy beside it
    from tuneplan.estimator.wrappers.zero3_quantized import (
        head_round_members,
        zero3_quantized_head_copy_bytes,
    )

    h, v = 16384, 128256
    spec = model_from_config(dict(model_type="llama", hidden_size=h, intermediate_size=53248,
                                  num_hidden_layers=2, num_attention_heads=128, num_key_value_heads=8,
                                  vocab_size=v, tie_word_embeddings=False), "llama-405b-2L")
    setup = build_setup(spec, method="qlora", precision="fp16", gpus=2, zero=3, rank=8,
                        targets="all-linear", gradient_checkpointing=False)
    run = resolve_run(spec, setup)
    assert head_round_members(run, 50_000_000) == [(h * 8, 2)]
    assert zero3_quantized_head_copy_bytes(run, 50_000_000) == v * h * 2 + h * 8 * 2


def test_the_embeddings_own_fetch_pops_nothing_and_its_release_lets_the_prefetcher_go_on() -> None:
    # Qwen2.5-32B over 3 layers, QLoRA nf4 rank 8 on the attention with checkpointing and a 1-label head
    # (persistent) in bf16 over 2 GPUs: packed q / o 5120 x 5120 / 2 = 13,107,200, k / v 5120 x 1024 / 2
    # = 2,621,440, gate / up / down 5120 x 27648 / 2 = 70,778,880 (LoRA matrices at most 40,960, under the
    # persistence threshold 1e5: no entries). Rounds of the 5e7 bucket under M = 1e9: [embedding
    # 778,567,680], [q k v o gate] 102.2e6, [up], and 48.4e6 left: [down]; A = 1.0224e9. At the embedding's
    # own fetch (the fifth) min(M - A, bucket) < 0: fetch_sub_module pops nothing, and the embedding's
    # forward releases it (its backward use lies past the reuse distance): A = 243.8e6 and the rounds go
    # on one a fetch, layers 1 and 2 three rounds each (A = 731.4e6 < M), the embedding's backward use
    # popped at the twelfth fetch, after layer 0's q_proj base layer (the eleventh: the four wrappers,
    # the embedding, the rotary module, layer 0, its input norm, its attention, q_proj's LoRA wrapper,
    # its base layer). Held in layer 0's backward: the layer's codes, the flat buffer and the embedding's
    # copy (simulate: the 778,567,680-element flat buffer from layer 0's q_proj lora_dropout, the copy
    # made at its recomputed q_proj base layer, the run's peak). The coordinator replayed
    # (zero3_module_trace.py) holds there layer 0's codes but down_proj's (popped in a later round), the
    # flat buffer of the round [q_proj, embedding] and the embedding's copy (q's copy among the codes)
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.wrappers.zero3_quantized_embedding import zero3_quantized_embedding_round

    base = resolve_model("Qwen/Qwen2.5-32B", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=3), "qwen2.5-32b-3L")
    setup = build_setup(spec, method="qlora", precision="bf16", framework="llamafactory", gpus=2, zero=3,
                        offload="all", rank=8, targets="attn", gradient_checkpointing=True, num_labels=1)
    run = resolve_run(spec, setup)
    assert run.dtypes.non_block == 2 and spec.embed_params == 152_064 * 5120
    layer = 2 * 13_107_200 + 2 * 2_621_440 + 2 * 70_778_880
    assert zero3_quantized_embedding_round(run, 50_000_000) == (
        0, layer + 13_107_200 + 778_567_680 * 2 + 778_567_680 * 2)


def test_a_tied_embedding_past_max_live_released_after_the_heads_backward_is_gathered_again() -> None:
    # a tied Llama of hidden 4096, intermediate 16384 and BLOOM's vocab 250880: the embedding,
    # 250880 x 4096 = 1,027,604,480 elements, fills stage3_max_live_parameters (1e9). QLoRA 4-bit with
    # checkpointing: a layer's 4 h^2 + 3 h f = 268,435,456 weights are 134,217,728 packed codes. With
    # 4 layers P = 536,870,912 < 1e9 (the head's forward reuses the embedding in reach) and 2 P >= 1e9 (its
    # own backward use does not): released after the head's backward, popped back beside all the codes:
    # 1,027,604,480 x 2 bytes + 536,870,912 = 2,592,079,872. With 3 layers 2 P = 805,306,368 < 1e9: kept,
    # nothing gathered again; without checkpointing the embedding has no backward use
    from tuneplan.estimator.wrappers.zero3_tied_backward import zero3_quantized_tied_regathered

    h, f, v = 4096, 16384, 250880
    for layers, expected in ((4, 1_027_604_480 * 2 + 536_870_912), (3, 0)):
        cfg = dict(model_type="llama", hidden_size=h, num_hidden_layers=layers, num_attention_heads=32,
                   num_key_value_heads=32, intermediate_size=f, vocab_size=v, tie_word_embeddings=True)
        spec = model_from_config(cfg, f"tied-llama-{layers}L")
        assert spec.embed_params == v * h and not spec.lm_head_params
        setup = build_setup(spec, method="qlora", precision="bf16", gpus=4, zero=3,
                            gradient_checkpointing=True)
        assert zero3_quantized_tied_regathered(resolve_run(spec, setup)) == expected
        plain = build_setup(spec, method="qlora", precision="bf16", gpus=4, zero=3,
                            gradient_checkpointing=False)
        assert zero3_quantized_tied_regathered(resolve_run(spec, plain)) == 0


def test_an_untied_embedding_past_max_live_pops_nothing_until_its_release() -> None:
    # gemma-2-27b widths over 2 layers, QLoRA fp4 rank 4 on the MLP with checkpointing and a 1-label head
    # (4,608 elements, persistent) in fp16 over 8 GPUs: E = 256,000 x 4,608 = 1,179,648,000 >= M = 1e9.
    # Packed q / o 4608 x 4096 / 2 = 9,437,184, k / v 4608 x 2048 / 2 = 4,718,592, gate / up / down
    # 4608 x 36864 / 2 = 84,934,656; LoRA matrices past 1e5: gate / up lora_B and down lora_A,
    # 36,864 x 4 = 147,456. The root's fetch pops the embedding; A = E > M, so the three wrappers below it
    # and the embedding's own fetch pop nothing (four empty rounds); its forward releases it (no head uses
    # it; its backward use lies past the reuse distance: 3 x 567e6 >= 1e9) and the rounds go on from the
    # rotary module: [q k v o gate] 113.2e6, [gate_B up], [up_B down_A down] per layer, six rounds (the
    # layers, 567e6, under M), the embedding's backward use the twelfth, popped at the twelfth fetch, after
    # layer 0's q_proj (the tenth: the four wrappers, the embedding, the rotary module, layer 0, its input
    # norm, its attention, q_proj). Held in layer 0's backward: the layer's codes, the flat buffer and the
    # embedding's copy: 283,115,520 + 2 x 1,179,648,000 x 2 B. (simulate: seed 101 r130, the second step's
    # round [q_proj, k_proj, embedding] popped at layer 0's v_proj; before the fix the cut stopped after
    # the embedding's first round, nothing counted.)
    from tuneplan.estimator.wrappers.zero3_quantized_embedding import zero3_quantized_embedding_round

    # (the coordinator replayed, zero3_module_trace.py: the round [q_proj, k_proj, embedding] waited at
    # layer 0's recomputed q_proj beside the layer's codes, its three LoRA matrices in 16 bits, the flat
    # buffer with q's and k's codes and the embedding's copy; gemma-2-27b's rope_theta given, so that its
    # rotary module is one of the fetches)
    cfg = dict(model_type="gemma2", hidden_size=4608, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=16, head_dim=128, intermediate_size=36864, vocab_size=256_000,
               rope_theta=10000.0)
    spec = model_from_config(cfg, "gemma-2-27b-2L")
    setup = build_setup(spec, method="qlora", precision="fp16-mixed", gpus=8, zero=3, rank=4, bits=4,
                        quant_type="fp4", targets="mlp", gradient_checkpointing=True, num_labels=1)
    run = resolve_run(spec, setup)
    assert run.dtypes.non_block == 2 and spec.embed_params == 1_179_648_000
    layer = 2 * 9_437_184 + 2 * 4_718_592 + 3 * 84_934_656
    assert layer == 283_115_520
    assert zero3_quantized_embedding_round(run, 50_000_000) == (
        0, layer + 3 * 147_456 * 2 + 9_437_184 + 4_718_592 + 2 * 1_179_648_000 * 2)
    # the same model with its tied LM head: the head's forward uses the embedding right after the layers
    # (567e6 < D), so its forward does not release it and nothing is prefetched
    tied = resolve_run(spec, build_setup(spec, method="qlora", precision="fp16-mixed", gpus=8, zero=3,
                                         rank=4, bits=4, quant_type="fp4", targets="mlp",
                                         gradient_checkpointing=True))
    # (replayed: no round of its own, the embedding kept gathered, once, through the lower layers' backward
    # beside their codes: what the bottom layer's row holds, not a copy)
    held = zero3_quantized_embedding_round(tied, 50_000_000)
    assert held[0] == 0 and 2 * 1_179_648_000 < held[1] < 2 * 1_179_648_000 + 2 * layer


def test_a_root_round_under_the_bucket_is_coalesced_and_its_flat_buffer_held_past_the_embedding() -> None:
    # gpt2 over 3 layers, QLoRA nf4 on c_attn in fp32 over 2 GPUs: the embeddings (wte 50,257 x 768 and wpe
    # 1,024 x 768) 39,383,808 elements, 4 B each; packed per layer c_attn 768 x 2304 / 2 = 884,736, attn
    # c_proj 294,912, c_fc and mlp c_proj 1,179,648: 3,538,944 bytes. The root's fetch pops rounds of the
    # 5e7 bucket: 39,383,808 + 3 x 3,538,944 = 50,000,640 elements, the last one crossing: one round,
    # coalesced: every member's copy and the flat buffer, kept until its last member's fetch in the top
    # layer: 2 x (39,383,808 x 4 + 3 x 3,538,944). (simulate: seed 101 r168, the 40,268,544-element fp32
    # flat buffer beside the embedding's copy at layer 2's c_fc, the run's peak; its LoRA B matrices past
    # the persistence threshold left out here.)
    from tuneplan.catalog.models import resolve_model

    base = resolve_model("openai-community/gpt2", allow_network=False)
    spec = model_from_config(dict(base.config, n_layer=3), "gpt2-3L")
    run = resolve_run(spec, build_setup(spec, method="qlora", precision="fp32", gpus=2, zero=3))
    assert spec.embed_params == 50_257 * 768 + 1_024 * 768 and run.dtypes.non_block == 4
    gathered = 39_383_808 * 4 + 3 * (884_736 + 294_912 + 2 * 1_179_648)
    assert zero3_quantized_at_embedding_bytes(run, 50_000_000) == 2 * gathered
