"""ZeRO-3's prefetcher (estimator/wrappers/zero3_coordinator.py), counted by hand on the tiny untied Llama:
under ``method=freeze`` the backward stops at the lowest trained layer, so the parameters used again after
the forward are the output head, the final norm and the trained layers; PEFT's LoRA modules are fetch
points of their own."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.wrappers.zero3_coordinator import (
    zero3_backward_uses,
    zero3_gathered_ahead,
    zero3_gathered_at_embedding,
    zero3_head_round,
)
from tuneplan.specs.model import model_from_config

from .sharded_tiny import KV, TINY, A, D, F, H, V

LAYER = H * A * D + 2 * H * KV * D + A * D * H + 3 * H * F + 2 * H  # linears + two RMSNorm weights


def test_freeze_uses_again_the_head_the_norm_and_the_trained_layers() -> None:
    spec = model_from_config(TINY, "tiny-llama-freeze")
    setup = build_setup(spec, method="freeze", freeze_trainable_layers=1, gpus=4, zero=3)
    assert zero3_backward_uses(spec, setup) == V * H + H + LAYER
    # a prefetch bucket of a whole layer per fetch lets the prefetcher run ahead: all of them at the loss
    assert zero3_gathered_ahead(spec, setup, LAYER) == V * H + H + LAYER


def test_peft_modules_are_fetch_points_of_the_prefetcher() -> None:
    # a LoRA linear runs base_layer, dropout, lora_A and lora_B as modules: with q_proj and v_proj
    # targeted a layer has 7 + 2 + 4 + 2 x 4 = 21 fetches instead of 13; a prefetch bucket of 2,000
    # elements then grants 42,000 >= one layer (36,992) per layer, and the prefetcher runs ahead: at the
    # loss it holds what the backward uses, all but the frozen embedding and layer 0's q/k/v
    spec = model_from_config(TINY, "tiny-llama-lora")
    setup = build_setup(spec, method="lora", gpus=4, zero=3, gradient_checkpointing=False)
    assert zero3_gathered_ahead(spec, setup, 2_000) == 0
    used = 2 * LAYER + 2 * V * H + H - V * H - (H * A * D + 2 * H * KV * D)
    assert zero3_gathered_ahead(spec, setup, 2_000, frozenset({"q_proj", "v_proj"})) == used


def test_zero3_embedding_backward_gathers_the_embedding(qwen7b) -> None:
    # the token embedding's pre-backward hook fetches its weight whole, beside the 5e8-element IPG bucket
    # and the flat 16-bit gradient partition (1/N of the trainable parameters, bf16)
    from tuneplan.estimator.memory_statics import memory_statics
    from tuneplan.estimator.run import resolve_run
    from tuneplan.estimator.xp import ceil_div

    setup = build_setup(qwen7b, method="full", precision="bf16-mixed", gpus=4, zero=3)
    run = resolve_run(qwen7b, setup)
    held = memory_statics(run).wrapped.embedding
    assert held is not None and not held.layers_hold_it
    flat = ceil_div(2 * run.param_plan.trainable_params, 4)
    assert held.gradients == 2 * 500_000_000 + flat + 2 * 152_064 * 3_584


def test_the_embedding_forward_holds_what_each_wrapper_fetch_prefetched() -> None:
    # a bucket of 5,000 elements: the first fetch takes the embedding (16,384), each later one pops until it
    # has 5,000 or more: q+k (6,144), v+o (6,144), gate (8,192), up (8,192). A LoRA model has four
    # parameterless wrappers above the embedding (PeftModel, LoraModel, LlamaForCausalLM, LlamaModel) and
    # the embedding's own fetch: five prefetches; a full fine-tune two wrappers, three prefetches
    spec = model_from_config(TINY, "tiny-llama-embedding")
    lora = build_setup(spec, method="lora", gpus=4, zero=3)
    assert zero3_gathered_at_embedding(spec, lora, 5_000) == V * H + 6_144 + 6_144 + 8_192 + 8_192
    full = build_setup(spec, method="full", gpus=4, zero=3)
    assert zero3_gathered_at_embedding(spec, full, 5_000) == V * H + 6_144 + 6_144
    # a bucket past the model's size: the whole model in one coalesced round, which the embedding's fetch
    # waits for: each parameter's copy beside the flat buffer, kept until the round's last parameter (the
    # head) is fetched
    assert zero3_gathered_at_embedding(spec, full, 10**7) == 2 * (2 * V * H + 2 * (LAYER - 2 * H))


def test_the_head_round_is_held_twice_until_the_head_is_fetched() -> None:
    # the forward trace: embedding 16,384; per layer q 4,096, k 2,048, v 2,048, o 4,096, gate/up/down 8,192;
    # head 16,384. Rounds of at least 30,000: embedding..gate0 (36,864), up0..gate1 (36,864), then up1,
    # down1 and the head (32,768): the round the head shares with the top layer's last two linears
    spec = model_from_config(TINY, "tiny-llama-head")
    assert zero3_head_round(spec, 30_000) == 8_192 + 8_192 + V * H
    # rounds of at least 20,000 end right before the head: a round of its own, gathered without a copy
    # once the persistent parameters stay gathered; in the first pass with a complete trace the final norm
    # (H, released by the record pass) is NOT_AVAILABLE and starts the head's round: coalesced, V H + H
    assert zero3_head_round(spec, 20_000) == V * H + H
    tied = model_from_config({**TINY, "tie_word_embeddings": True}, "tiny-llama-tied")
    assert zero3_head_round(tied, 30_000) == 0


def test_the_loss_holds_max_live_plus_a_layer_parameter_not_the_head() -> None:
    # a 4-layer untied Llama of hidden 4096, intermediate 16384 and vocab 131072 (no GQA), LoRA with
    # checkpointing: the backward uses the head (V H = 536,870,912), the final norm (H), 4 layers of
    # 4 H^2 + 3 H F + 2 H = 268,443,648 each and, last, the embedding (V H): 2,684,383,232 in all.
    # Before the embedding 2,147,512,320 >= stage3_max_live_parameters (1e9): a layer parameter crosses
    # the limit, not the head. The queue after the head, the top layer's recompute in forward order (q k v
    # o: H^2 = 16,777,216 each; gate up down: H F = 67,108,864 each; the norms and rank-16 LoRA matrices,
    # 65,536 at most, persistent), then layer 2's: 536,870,912 + 4 H^2 + 3 H F = 805,306,368, + 4 H^2 =
    # 872,415,232, + gate = 939,524,096 (< 1e9), + up = 1,006,632,960: up crosses, held at the loss.
    from tuneplan.specs.model import model_from_config

    h, f, v = 4096, 16384, 131072
    cfg = dict(model_type="llama", hidden_size=h, num_hidden_layers=4, num_attention_heads=32,
               num_key_value_heads=32, intermediate_size=f, vocab_size=v, tie_word_embeddings=False)
    spec = model_from_config(cfg, "llama-4L")
    setup = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=True)
    assert zero3_backward_uses(spec, setup) == 2 * v * h + h + 4 * (4 * h * h + 3 * h * f + 2 * h)
    assert zero3_gathered_ahead(spec, setup, 50_000_000, frozenset({"q_proj", "v_proj"})) == (
        v * h + 8 * h * h + 5 * h * f) == 1_006_632_960


def test_everything_is_gathered_when_all_but_the_embedding_fits_under_max_live() -> None:
    # the same model with 2 layers: after the head, 2 layers (536,887,296) and the final norm come before
    # the embedding, under 1e9: the round that crosses the limit pops the embedding too, so the whole
    # backward use after the head is gathered through the top layers' backward
    from tuneplan.estimator.wrappers.zero3_coordinator import zero3_gathered_in_backward
    from tuneplan.specs.model import model_from_config

    h, f, v = 4096, 16384, 131072
    cfg = dict(model_type="llama", hidden_size=h, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=32, intermediate_size=f, vocab_size=v, tie_word_embeddings=False)
    spec = model_from_config(cfg, "llama-2L")
    setup = build_setup(spec, method="full", gpus=2, zero=3)
    assert zero3_gathered_in_backward(spec, setup) == h + 2 * (4 * h * h + 3 * h * f + 2 * h) + v * h


def test_a_head_past_the_reuse_distance_is_held_twice_at_the_final_norm_of_the_first_complete_pass() -> None:
    # Qwen2.5-72B widths, 3 layers, untied head V H = 152,064 x 8,192 = 1,245,708,288 >= 1e9
    # (stage3_max_reuse_distance): the round [final norm (8,192, released by the record pass), head] is
    # coalesced; at the norm's fetch the head has its copy and the flat buffer is still filed under it.
    from tuneplan.estimator.wrappers.zero3_coordinator import zero3_head_round_first_pass

    h, v = 8192, 152064
    cfg = dict(model_type="qwen2", hidden_size=h, num_hidden_layers=3, num_attention_heads=64,
               num_key_value_heads=8, intermediate_size=29568, vocab_size=v, tie_word_embeddings=False)
    spec = model_from_config(cfg, "qwen2.5-72b-3L")
    setup = build_setup(spec, method="freeze", gpus=2, zero=3, gradient_checkpointing=True)
    assert zero3_head_round_first_pass(spec, setup) == 2 * v * h + h
    # a head under the distance: the prefetcher's rounds decide instead (zero3_head_round)
    small = model_from_config({**cfg, "vocab_size": 32000}, "qwen2.5-72b-3L-small-vocab")
    small_setup = build_setup(small, method="freeze", gpus=2, zero=3, gradient_checkpointing=True)
    assert zero3_head_round_first_pass(small, small_setup) == 0


def test_freeze_keeps_only_the_trained_layers_gathered_from_forward_to_backward() -> None:
    # gemma-2b widths, 3 layers (h 2048, 8 heads of 256, 1 KV head, f 16384, vocab 256000, tied): a layer is
    # 2 h (8 x 256) + 2 h 256 + 3 h f = 8,388,608 + 1,048,576 + 100,663,296 (+ 2 norms of h); the tied head
    # V h = 524,288,000 is fetched twice between a layer's forward and backward (the head's forward and
    # backward): 1,048,576,000 >= stage3_max_reuse_distance, no layer kept by the distance. The prefetcher
    # records them instead (zero3_head_reuse): from the head's backward use it pops the layers' linears
    # (2 h (8 x 256) + 2 h 256 + 3 h f = 110,100,480 each) in backward order, 524,288,000 + 3 x 110,100,480
    # = 854,589,440 < stage3_max_live_parameters, to the queue's end; the backward of a freeze run with the
    # top 2 trained stops at layer 1, so layer 0 is never queued.
    from tuneplan.estimator.wrappers.zero3_coordinator import zero3_kept_params, zero3_layers_kept
    from tuneplan.estimator.wrappers.zero3_head_reuse import zero3_recorded_at_loss

    h, f, v = 2048, 16384, 256000
    cfg = dict(model_type="gemma", hidden_size=h, num_hidden_layers=3, num_attention_heads=8,
               num_key_value_heads=1, head_dim=256, intermediate_size=f, vocab_size=v)
    spec = model_from_config(cfg, "gemma-2b-3L")
    layer = 2 * h * 8 * 256 + 2 * h * 256 + 3 * h * f + 2 * h
    assert spec.largest_layer_params == layer
    assert zero3_layers_kept(spec, v * h) == 0
    linears = 110_100_480
    assert layer == linears + 2 * h
    freeze = build_setup(spec, method="freeze", gpus=2, zero=3, gradient_checkpointing=False)
    assert zero3_kept_params(spec, freeze, v * h, frozenset()) == 0
    assert zero3_recorded_at_loss(spec, freeze, frozenset(), v * h, 0) == v * h + 2 * linears
    full = build_setup(spec, method="full", gpus=2, zero=3, gradient_checkpointing=False)
    assert zero3_recorded_at_loss(spec, full, frozenset(), v * h, 0) == v * h + 3 * linears


def test_qlora_layers_partitioned_as_packed_bytes_let_the_prefetcher_reach_the_embedding() -> None:
    # Mistral-7B widths, 2 layers (h 4096, KV 1024, f 14336, vocab 32000, untied), QLoRA 4-bit with
    # checkpointing: a layer's linears W = 2 h^2 + 2 h KV + 3 h f = 218,103,808 weights are 109,051,904
    # packed uint8 elements (Params4bit's ds_numel); 13 fetches x 5e7 >= a layer; head + final norm + both
    # layers = 349,196,288 < stage3_max_live_parameters: the embedding is popped too, all gathered.
    from tuneplan.estimator.wrappers.zero3_quantized import zero3_quantized_ahead_bytes

    h, kv, f, v = 4096, 1024, 14336, 32000
    cfg = dict(model_type="mistral", hidden_size=h, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, intermediate_size=f, vocab_size=v,
               tie_word_embeddings=False)
    spec = model_from_config(cfg, "mistral-2L")
    ckpt = build_setup(spec, method="qlora", gpus=2, zero=3, gradient_checkpointing=True)
    packed = (2 * h * h + 2 * h * kv + 3 * h * f) // 2
    norms = 2 * 2 * h + h
    assert zero3_quantized_ahead_bytes(spec, ckpt, 50_000_000, 2) == (2 * v * h + norms) * 2 + 2 * packed
    plain = build_setup(spec, method="qlora", gpus=2, zero=3, gradient_checkpointing=False)
    assert zero3_quantized_ahead_bytes(spec, plain, 50_000_000, 2) == 0


def test_a_tied_embedding_over_max_live_kept_to_the_head_stops_the_prefetcher() -> None:
    # a tied Llama of hidden 4096, intermediate 16384 and BLOOM's vocab 250880: the embedding holds
    # 250880 * 4096 = 1,027,604,480 elements >= stage3_max_live_parameters (1e9). With 3 layers of
    # 4 H^2 + 3 H F + 2 H = 268,443,648 each (805,330,944 with the final norm's 4,096 under
    # stage3_max_reuse_distance, 1e9) the head's forward reuses the embedding in reach, so it is never
    # released; min(1e9 - n_available, bucket) < 0: nothing is prefetched. With 4 layers
    # (1,073,778,688) the embedding is released after its forward and the prefetcher runs again.
    from tuneplan.specs.model import model_from_config

    h, f, v = 4096, 16384, 250880
    layer = 4 * h * h + 3 * h * f + 2 * h
    assert 3 * layer + h < 1_000_000_000 <= 4 * layer + h and v * h >= 1_000_000_000
    for layers, runs in ((3, False), (4, True)):
        cfg = dict(model_type="llama", hidden_size=h, num_hidden_layers=layers, num_attention_heads=32,
                   num_key_value_heads=32, intermediate_size=f, vocab_size=v, tie_word_embeddings=True)
        spec = model_from_config(cfg, f"tied-llama-{layers}L")
        setup = build_setup(spec, method="full", gpus=2, zero=3)
        assert bool(zero3_gathered_ahead(spec, setup, 50_000_000)) is runs


def test_the_trained_untied_heads_backward_makes_its_whole_gradient_beside_the_loss_set() -> None:
    # Llama 2 7B, full fine-tune in bf16 under ZeRO-3 over 2 GPUs, 1 x 64 tokens: the head's backward
    # makes dW = dlogits^T x whole, 32000 x 4096 x 2 B = 262,144,000 B, from the logits' gradient cast back
    # to bf16 (64 x 32000 x 2 B = 4,096,000 B), the head still gathered with what the loss held
    # (release_sub_module frees it after its backward). A LoRA run's head is frozen: no such instant.
    from tuneplan.api import resolve_run
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.instants import memory_at, named

    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    run = resolve_run(spec, build_setup(spec, method="full", precision="bf16", gpus=2, zero=3, seq=64,
                                        batch=1))
    m = memory_at(run, 1, 64)
    head, loss = named(m.rows["backward_head"]), named(m.rows["backward_start"])
    assert head.backward_temp == 32000 * 4096 * 2
    assert head.logits_loss == 64 * 32000 * 2
    assert head.parallel_buffers == loss.parallel_buffers
    lora = resolve_run(spec, build_setup(spec, method="lora", precision="bf16", gpus=2, zero=3, seq=64))
    assert "backward_head" not in memory_at(lora, 1, 64).rows


def test_freeze_with_checkpointing_back_propagates_to_the_embedding() -> None:
    # transformers' gradient_checkpointing_enable calls enable_input_require_grads (the HF Trainer and
    # LLaMA-Factory): the embedding's output requires grad, so the backward runs through every layer,
    # the frozen ones too, and DeepSpeed fetches every parameter again, the embedding last: the tiny
    # untied Llama's head V H, final norm H, 2 layers and embedding V H, all of it under max_live
    from tuneplan.estimator.wrappers.zero3_coordinator import embedding_used_last

    spec = model_from_config(TINY, "tiny-llama-freeze-gc")
    setup = build_setup(spec, method="freeze", freeze_trainable_layers=1, gpus=4, zero=3,
                        gradient_checkpointing=True)
    assert zero3_backward_uses(spec, setup) == 2 * V * H + H + 2 * LAYER
    assert embedding_used_last(spec, setup)


def test_the_lower_layers_backward_holds_the_embedding_once_the_rest_fits_under_max_live() -> None:
    # the 4-layer untied Llama (hidden 4096, intermediate 16384, vocab 131072), LoRA with checkpointing:
    # layers of 268,443,648; from the bottom 1, 2, 3 of them hold 268,443,648, 536,887,296 and 805,330,944,
    # under 1e9 (4: 1,073,774,592, over): through layer 2's backward the prefetcher has popped layers 0-2
    # and the embedding (131072 x 4096 = 536,870,912): 1,342,201,856
    from tuneplan.estimator.wrappers.zero3_lower_layers import zero3_gathered_in_lower_layers

    h, f, v = 4096, 16384, 131072
    cfg = dict(model_type="llama", hidden_size=h, num_hidden_layers=4, num_attention_heads=32,
               num_key_value_heads=32, intermediate_size=f, vocab_size=v, tie_word_embeddings=False)
    spec = model_from_config(cfg, "llama-4L")
    gc = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=True)
    assert zero3_gathered_in_lower_layers(spec, gc) == 1_342_201_856
    # without checkpointing a LoRA run never fetches the embedding again
    plain = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=False)
    assert zero3_gathered_in_lower_layers(spec, plain) == 0


def test_an_embedding_released_after_its_forward_leaves_room_for_the_heads_round() -> None:
    # Llama-3-8B shape at 2 layers (h 4096, 8 KV heads of 128, f 14336, vocab 128256, untied): the forward
    # trace holds 2 x 525,336,576 + 2 x 218,103,808 = 1.487e9 elements, over stage3_max_live_parameters;
    # LoRA without checkpointing: the frozen embedding has no backward use and is released after its
    # forward, leaving 9.616e8 under it, so the rounds of 5e7 reach the head uncut: [E], [q k v o gate],
    # [up], [down] per layer, [head] alone, which the final norm (H, NOT_AVAILABLE in the first complete
    # pass, the second micro-batch of the first step) starts: V H + H. A full fine-tune keeps the
    # embedding for its backward: 9.615e8 before the head, still under the limit, so the head is popped
    # too; with one micro-batch per step the norm is gathered again after the step (_post_step): alone.
    v, h = 128256, 4096
    cfg = dict(model_type="llama", hidden_size=h, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, vocab_size=v, tie_word_embeddings=False)
    spec = model_from_config(cfg, "llama3-2L")
    lora = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=False, grad_accum=2)
    assert zero3_head_round(spec, 50_000_000, lora) == v * h + h
    full = build_setup(spec, method="full", gpus=2, zero=3, gradient_checkpointing=False)
    assert zero3_head_round(spec, 50_000_000, full) == 0
    assert zero3_head_round(spec, 50_000_000) == v * h + h


def test_a_tied_heads_weight_is_used_again_in_the_backward() -> None:
    # LoRA without checkpointing: the frozen embedding's output does not require grad, so its own backward
    # never runs; tied, its weight is the head's, which the head's backward fetches (lm_head's pre-backward
    # hook): the tied model uses again as many elements as the untied one (whose extra head, V H, is the
    # one used), every parameter but the embedding's V H and layer 0's projections outside the graph
    from tuneplan.estimator.lora_bottom_layer import bottom_gradient_free_params

    untied = model_from_config(TINY, "tiny-llama-untied")
    tied = model_from_config({**TINY, "tie_word_embeddings": True}, "tiny-llama-tied-lora")
    targets = frozenset({"q_proj", "v_proj"})
    setup = build_setup(tied, method="lora", gpus=2, zero=3, gradient_checkpointing=False)
    free = bottom_gradient_free_params(tied, targets)
    assert zero3_backward_uses(tied, setup, targets) == tied.params_total - free
    assert zero3_backward_uses(untied, setup, targets) == untied.params_total - V * H - free
    assert untied.params_total - V * H == tied.params_total


def test_freeze_bottom_linear_rounds_past_the_released_embedding() -> None:
    # Llama-3-8B widths, 3 layers, untied, the top 2 trained, DeepSpeed's 5e7-element prefetch bucket:
    # rounds [E] | [q k v o gate] 100,663,296 | [up] | [down] per layer | [head], E = head = 525,336,576.
    # The wrappers (2) and the embedding pop 3 rounds before its forward; the frozen embedding is then
    # released, so the later rounds are not cut by stage3_max_live_parameters (E + 3 x 218,103,808 + the
    # head would pass 1e9). At layer 0's o_proj 11 fetches (2 wrappers, embedding, rotary_emb, layer,
    # norm, attention, q, k, v, o) have popped all 11 rounds: the layers and the head, less the released
    # embedding, 1,179,648,000; the q..gate round's flat buffer beside its copies, less q, k and v
    # (layer 0 is frozen below the trained layers: no backward use, released after their forward):
    # + 100,663,296 - 25,165,824 = 1,255,145,472 (the simulation's gathered blocks at that mm).
    from tuneplan.estimator.wrappers.zero3_bottom_forward import zero3_gathered_at_first_linear

    cfg = dict(model_type="llama", hidden_size=4096, num_hidden_layers=3, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False)
    spec = model_from_config(cfg, "llama3-8b-3l")
    setup = build_setup(spec, method="freeze", freeze_trainable_layers=2, gpus=4, zero=3,
                        gradient_checkpointing=False)
    assert zero3_gathered_at_first_linear(spec, setup, 50_000_000) == 1_255_145_472


def test_the_head_may_cross_the_live_limit_and_the_norm_joins_it_only_before_a_step() -> None:
    # Llama-3-8B shape at 3 layers (h 4096, 8 KV heads of 128, f 14336, vocab 128256, untied), LoRA without
    # checkpointing: the forward trace is E = V H = 525,336,576, 3 layers of 4096 x (4096 + 2 x 1024 +
    # 4096) + 3 x 4096 x 14336 = 218,103,808 each, and the head V H: 1.705e9 in all, 1.180e9 once the
    # frozen embedding is released after its forward, over stage3_max_live_parameters (1e9). But the
    # prefetcher checks the limit before each pop: what is gathered before the head is the 3 layers,
    # 654,311,424 < 1e9, so the head is popped and crosses it. Rounds of 5e7: [head] alone, which the
    # final norm (H, released by the record pass) starts in the first complete pass when that is the
    # second micro-batch of the first step: V H + H.
    v, h = 128256, 4096
    cfg = dict(model_type="llama", hidden_size=h, num_hidden_layers=3, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, vocab_size=v, tie_word_embeddings=False)
    spec = model_from_config(cfg, "llama3-3L")
    accum = build_setup(spec, method="lora", gpus=8, zero=3, gradient_checkpointing=False, grad_accum=2)
    assert zero3_head_round(spec, 50_000_000, accum) == v * h + h
    # one micro-batch per step: the first complete pass is the second step's, after
    # DeepSpeedZeroOptimizer_Stage3._post_step gathered the persistent parameters again: the head alone,
    # gathered without a copy
    single = build_setup(spec, method="lora", gpus=8, zero=3, gradient_checkpointing=False, grad_accum=1)
    assert zero3_head_round(spec, 50_000_000, single) == 0


def test_a_partitioned_lora_b_of_the_top_linear_joins_the_heads_round() -> None:
    # Llama-3-8B widths at 2 layers (h 4096, 8 KV heads of 128, f 14336, vocab 128256, untied), LoRA of
    # rank 64 on every linear, no checkpointing, one micro-batch per step. LoRA matrices over
    # stage3_param_persistence_threshold (1e5) are partitioned: lora_A 64 x 4096 = 262,144 of q, k, v, o,
    # gate, up and 64 x 14336 = 917,504 of down; lora_B 4096 x 64 = 262,144 of q, o and down,
    # 14336 x 64 = 917,504 of gate and up (k's and v's 1024 x 64 stay whole). The trace lists lora_A at
    # its wrapper's fetch (an external parameter: the wrapper reads its dtype), before the weight, and
    # lora_B after it. Rounds of 5e7 close on each 58,720,256-element MLP weight: [.. gate],
    # [gate.B up.A up], [up.B down.A down], then [down.B, head]: coalesced, its flat buffer held beside
    # the head's copy until the head's fetch: 262,144 + V H (simulate: DeepSeek-R1-Distill-Llama-8B, 4
    # layers, the 525,598,720-element round popped in layer 0, beside the head's copy at the final norm).
    # Without the adapters in the trace the head is alone in its round, gathered without a copy: 0.
    v, h = 128256, 4096
    cfg = dict(model_type="llama", hidden_size=h, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, vocab_size=v, tie_word_embeddings=False)
    spec = model_from_config(cfg, "llama3-2L-r64")
    setup = build_setup(spec, method="lora", rank=64, gpus=2, zero=3, gradient_checkpointing=False,
                        grad_accum=1)
    every = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
    assert zero3_head_round(spec, 50_000_000, setup, every) == 64 * h + v * h
    assert zero3_head_round(spec, 50_000_000, setup) == 0


def test_the_loss_holds_the_backward_queue_up_to_the_parameter_crossing_max_live() -> None:
    # Llama-2-70b widths (h 8192, 64 heads, 8 KV heads of 128, f 28672, vocab 32000), 2 layers, LoRA on q/v
    # (rank 8: lora_A 8 x 8192 = 65,536, lora_B at most 65,536, persistent) without checkpointing over 2 GPUs.
    # The backward fetches the head (32000 x 8192 = 262,144,000), then the top layer in reverse: down, up,
    # gate (8192 x 28672 = 234,881,024 each), o (67,108,864), v, k (8,388,608), q. Running sum: 262.1e6,
    # 497.0e6, 731.9e6, 966.8e6 (< 1e9), + o = 1,033,895,936 >= 1e9: o_proj crosses, and that is what the
    # loss holds, not 1e9 plus the largest parameter (1.2349e9).
    from tuneplan.estimator.wrappers.zero3_coordinator import zero3_gathered_ahead
    from tuneplan.specs.profiles import model_as_built

    cfg = dict(model_type="llama", hidden_size=8192, num_hidden_layers=2, num_attention_heads=64,
               num_key_value_heads=8, intermediate_size=28672, vocab_size=32000, tie_word_embeddings=False)
    spec = model_as_built(model_from_config(cfg, "llama70-2L"), "hf")
    setup = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=False, rank=8)
    head, mlp, o = 32000 * 8192, 8192 * 28672, 8192 * 8192
    targets = frozenset({"q_proj", "v_proj"})
    assert zero3_gathered_ahead(spec, setup, 50_000_000, targets) == head + 3 * mlp + o == 1_033_895_936


NEMO = dict(model_type="mistral", hidden_size=5120, num_hidden_layers=2, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128, intermediate_size=14336, vocab_size=131072,
            tie_word_embeddings=False)


def test_an_embedding_past_the_reuse_distance_is_released_before_the_head_round() -> None:
    # Mistral-Nemo at 2 layers, freeze of both with checkpointing, two micro-batches (LLaMA-Factory).
    # E = head = 131072 x 5120 = 671,088,640; per layer q and o 20,971,520, k and v 5,242,880, gate, up,
    # down 73,400,320. The embedding's backward use (enable_input_require_grads) is 3 x 545,285,120 +
    # 2 x 671,088,640 > 1e9 elements down the trace: released after its forward. Rounds of 5e7: [E]
    # (671.1e6 gathered), [q k v o] (52,428,800: 723.5e6), [gate] (796.9e6), then E is released (125.8e6),
    # [up], [down], layer 1's four rounds (545.2e6), [head]: min(1e9 - 545.2e6, 5e7) > 0 pops it. In the
    # first pass with a complete trace the final norm (5120) starts the head's round: 671,093,760 (simulate:
    # seed 97 r155, that flat buffer popped at layer 0's v_proj, beside the head's copy at model.norm).
    # Kept gathered, the embedding would stop the rounds at 1.0695e9 elements, before the head.
    from tuneplan.api import resolve_run

    spec = model_from_config(NEMO, "nemo-2L")
    setup = build_setup(spec, method="freeze", gpus=4, zero=3, gradient_checkpointing=True, grad_accum=2,
                        framework="llamafactory", offload="optimizer")
    assert zero3_head_round(resolve_run(spec, setup).model, 50_000_000, setup) == 671_093_760


def test_the_first_steps_head_round_comes_before_the_optimizer_states() -> None:
    # the same model and round without offload: it is held twice at the head's forward in the first step's
    # second micro-batch, before AdamW's first step() makes its states: the trained layers' partition,
    # 2 x 272,640,000 / 4 GPUs = 136,320,000 elements, two fp32 states each, and the fused AdamW's device
    # step scalar (one 512-byte block), are not there yet. With one micro-batch a step the norm is gathered
    # again after each step: the head is alone in its round, no forward_head instant.
    from tuneplan.api import resolve_run
    from tuneplan.estimator.instants import memory_at, named

    spec = model_from_config(NEMO, "nemo-2L")
    two = build_setup(spec, method="freeze", gpus=4, zero=3, gradient_checkpointing=True, grad_accum=2,
                      framework="llamafactory", batch=1, seq=128)
    rows = memory_at(resolve_run(spec, two), 1, 128).rows
    assert named(rows["forward_head"]).optimizer_temp == -(2 * 4 * 136_320_000 + 512)
    one = build_setup(spec, method="freeze", gpus=4, zero=3, gradient_checkpointing=True, grad_accum=1,
                      framework="llamafactory", batch=1, seq=128)
    assert "forward_head" not in memory_at(resolve_run(spec, one), 1, 128).rows


def test_a_tied_embedding_reused_by_the_head_within_the_reuse_distance_stays_gathered() -> None:
    # Falcon-7B widths at 3 layers (h 4544, one KV head of 64, f 18176, vocab 65024, head tied), freeze of
    # the top layer without checkpointing: the embedding has no backward use, but __params_to_release
    # walks the later modules up to stage3_max_reuse_distance (1e9): the 3 layers, 3 x 269,060,992 =
    # 807,182,976 < 1e9, then lm_head, whose weight is the embedding's: kept through the forward.
    # Trace E = 65024 x 4544 = 295,469,056, per layer qkv 4544 x 4672 = 21,229,568, dense 20,647,936,
    # h_to_4h and 4h_to_h 82,591,744 each. Rounds of 5e7: [E], [qkv dense h_to_4h] = 124,469,248,
    # [4h_to_h], per layer. At layer 0's query_key_value 7 fetches have popped (the two wrappers, the
    # embedding, rotary_emb, the layer, its norm, the attention): E + 3 x (124,469,248 + 82,591,744) =
    # 916,652,032, plus the copies of the waited qkv..h_to_4h round beside its flat buffer: 1,041,121,280
    # (simulate: falcon-7b, 3 layers, freeze over 8 GPUs: the gathered blocks at that mm, less the norms).
    # With the embedding released after its forward: 745,652,224.
    from tuneplan.estimator.wrappers.zero3_bottom_forward import zero3_gathered_at_first_linear

    cfg = dict(model_type="falcon", hidden_size=4544, num_hidden_layers=3, num_attention_heads=71,
               multi_query=True, new_decoder_architecture=False, parallel_attn=True, bias=False,
               vocab_size=65024, tie_word_embeddings=True)
    spec = model_from_config(cfg, "falcon-7b-3l")
    setup = build_setup(spec, method="freeze", freeze_trainable_layers=1, gpus=8, zero=3,
                        gradient_checkpointing=False)
    assert zero3_gathered_at_first_linear(spec, setup, 50_000_000) == 1_041_121_280
