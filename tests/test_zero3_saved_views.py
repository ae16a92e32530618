"""ZeRO-3 memory a later pass does not show, counted by hand from DeepSpeed 0.19.8 and transformers 5.25:
Falcon's ``input @ self.weight.T`` saves a view that keeps a released gathered weight
(estimator/wrappers/zero3_saved_views.py), and the first pass with a complete trace gathers the embedding in
one coalesced round with the persistent parameters the record pass released
(zero3_first_pass.py)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.wrappers.zero3_coordinator import zero3_layers_kept
from tuneplan.estimator.wrappers.zero3_first_pass import (
    zero3_first_pass_embedding_round,
    zero3_first_pass_round,
)
from tuneplan.estimator.wrappers.zero3_saved_views import layer_viewed_weights, zero3_view_kept
from tuneplan.specs.model import model_from_config
from tuneplan.specs.profiles import model_as_built

H, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 8192, 128, 8, 64, 65024
FALCON = dict(model_type="falcon", hidden_size=H, num_hidden_layers=3, num_attention_heads=HEADS,
              num_kv_heads=KV_HEADS, new_decoder_architecture=True, parallel_attn=True, bias=False,
              multi_query=True, alibi=False, vocab_size=VOCAB)
QKV = H * (H + 2 * KV_HEADS * HEAD_DIM)  # 75,497,472
DENSE = H * H
UP = DOWN = 4 * H * H


# DeepSeek-V2-Lite widths at 5 layers, the first dense: E 64 experts of f 1408, h 2048
DEEPSEEK_V2_LITE_5L = dict(model_type="deepseek_v2", hidden_size=2048, num_hidden_layers=5,
                           num_attention_heads=16, num_key_value_heads=16, intermediate_size=10944,
                           moe_intermediate_size=1408, n_routed_experts=64, n_shared_experts=2,
                           num_experts_per_tok=6, first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=None,
                           qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, vocab_size=102400,
                           tie_word_embeddings=False)


def test_falcon_lora_keeps_the_released_layers_viewed_weights() -> None:
    # LoRA on query_key_value, no checkpointing: in the bottom layer only the attention's dense reads a
    # tensor that requires grad (qkv's LoRA output); the MLP reads ln_mlp(input), nothing upstream of it
    # trains. The tied head, fetched by its forward and its backward (2 V H = 1,065,353,216 >=
    # stage3_max_reuse_distance), leaves no layer kept by the distance (what the prefetcher records of the
    # top one: test_zero3_head_reuse.py); with one kept, the two below are released.
    spec = model_from_config(FALCON, "falcon-3L")
    setup = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=False)
    targets = frozenset({"query_key_value"})
    assert layer_viewed_weights(spec, setup, targets, bottom=True) == DENSE
    assert layer_viewed_weights(spec, setup, targets, bottom=False) == QKV + DENSE + UP + DOWN
    assert zero3_layers_kept(spec, VOCAB * H) == 0
    assert zero3_view_kept(spec, setup, targets, 1, holds_all=False) == DENSE + QKV + DENSE + UP + DOWN
    # the recompute's parameters are not released before the layer's backward: the views share them
    ckpt = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=True)
    assert zero3_view_kept(spec, ckpt, targets, 1, holds_all=False) == 0
    assert zero3_view_kept(spec, setup, targets, 1, holds_all=True) == 0


def test_a_full_fine_tune_saves_every_view_and_nn_linear_models_none() -> None:
    spec = model_from_config(FALCON, "falcon-3L")
    full = build_setup(spec, method="full", gpus=2, zero=3, gradient_checkpointing=False)
    assert layer_viewed_weights(spec, full, frozenset(), bottom=True) == QKV + DENSE + UP + DOWN
    llama = model_from_config(dict(model_type="llama", hidden_size=4096, num_hidden_layers=3,
                                   num_attention_heads=32, num_key_value_heads=32, intermediate_size=16384,
                                   vocab_size=32000), "llama-3L")
    lora = build_setup(llama, method="lora", gpus=2, zero=3, gradient_checkpointing=False)
    assert zero3_view_kept(llama, lora, frozenset({"q_proj"}), 0, holds_all=False) == 0


def test_the_first_complete_pass_gathers_the_embedding_with_the_persistent_parameters() -> None:
    # a 2-layer Llama (4 H^2 + 3 H F = 268,435,456 per layer) with a 2-label head (2 H = 8,192, under
    # stage3_param_persistence_threshold 1e5), LoRA with checkpointing: between the embedding's forward and
    # its backward the trace holds the layers three times (forward, recompute, backward), 1.61e9 >= 1e9,
    # so the embedding is released after its forward; everything but the embedding (5.4e8) fits under
    # stage3_max_live_parameters, so the prefetcher reaches its backward use in the forward, in one round
    # with the final norm and the head: the flat buffer of V H elements is held beside the copy.
    h, f, v = 4096, 16384, 50688
    cfg = dict(model_type="llama", hidden_size=h, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=32, intermediate_size=f, vocab_size=v, tie_word_embeddings=False)
    spec = model_as_built(model_from_config(cfg, "llama-2L"), "hf", 2)
    assert spec.lm_head_params == 2 * h
    # (two micro-batches per step: that first complete pass is the first step's second micro-batch)
    ckpt = build_setup(spec, method="lora", gpus=4, zero=3, gradient_checkpointing=True, num_labels=2,
                       grad_accum=2)
    targets = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
    assert zero3_first_pass_embedding_round(spec, ckpt, 50_000_000, targets) == v * h
    # without checkpointing the frozen embedding has no backward use
    plain = build_setup(spec, method="lora", gpus=4, zero=3, gradient_checkpointing=False, num_labels=2,
                        grad_accum=2)
    assert zero3_first_pass_embedding_round(spec, plain, 50_000_000, targets) == 0
    # one layer: 3 x 268,443,648 < 1e9, the embedding stays gathered from its forward to its backward
    one = model_as_built(model_from_config({**cfg, "num_hidden_layers": 1}, "llama-1L"), "hf", 2)
    one_setup = build_setup(one, method="lora", gpus=4, zero=3, gradient_checkpointing=True, num_labels=2,
                            grad_accum=2)
    assert zero3_first_pass_embedding_round(one, one_setup, 50_000_000, targets) == 0
    # an LM head (V H, far over the persistence threshold) ends its own round before the embedding's
    lm = model_from_config(cfg, "llama-2L-lm")
    lm_setup = build_setup(lm, method="lora", gpus=4, zero=3, gradient_checkpointing=True, grad_accum=2)
    assert zero3_first_pass_embedding_round(lm, lm_setup, 50_000_000, targets) == 0


def test_after_a_step_the_embedding_round_holds_what_the_forward_trace_left() -> None:
    # One micro-batch per step: the first complete pass is the second step's, after the first step's
    # DeepSpeedZeroOptimizer_Stage3._post_step gathered the persistent parameters again (the final norm, the
    # 2 H = 8,192-element head, LoRA matrices of at most 1e5 elements). Llama (h 4096, 32 heads, 8 KV heads,
    # f 14336, vocab 128256, E = 525,336,576), 2 layers, LoRA with checkpointing over 2 GPUs.
    h, f, v = 4096, 14336, 128256
    cfg = dict(model_type="llama", hidden_size=h, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=f, vocab_size=v, tie_word_embeddings=False)
    spec = model_as_built(model_from_config(cfg, "llama31-2L"), "hf", 2)
    # rank 8 on q/v: every LoRA matrix (at most 8 x 4096 = 32,768) persistent. Per layer q 16,777,216,
    # k v 4,194,304, o 16,777,216, gate up down 58,720,256; the 5e7 rounds: [E], then per layer
    # [q k v o gate] (4.19e7 < 5e7 before gate), [up], [down]: the embedding's backward use starts a round
    # of its own, gathered into its own storage (no flat buffer, no copy)
    qv = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=True, num_labels=2, rank=8)
    assert zero3_first_pass_embedding_round(spec, qv, 50_000_000, frozenset({"q_proj", "v_proj"})) == 0
    # (before any step, two micro-batches: the norm and the head start the round, its flat buffer E)
    two = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=True, num_labels=2, rank=8,
                      grad_accum=2)
    assert zero3_first_pass_embedding_round(spec, two, 50_000_000, frozenset({"q_proj", "v_proj"})) == v * h
    # rank 128 on down_proj: lora_A 128 x 14336 = 1,835,008 before the weight, lora_B 4096 x 128 = 524,288
    # after it, both partitioned. Layer 0: [q k v o gate], [up], [A W] (6.06e7); layer 1: [B(0) q k v o
    # gate] (5.2e5 + 4.19e7 < 5e7 before gate), [up], [A W]; then [B(1), E]: a coalesced round, its flat
    # buffer 524,288 + 525,336,576 = 525,860,864 elements held beside the copies
    down = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=True, num_labels=2,
                       rank=128)
    assert zero3_first_pass_embedding_round(spec, down, 50_000_000, frozenset({"down_proj"})) == 525_860_864


def test_the_bottom_layer_outside_the_graph_is_not_fetched_again_nor_kept() -> None:
    # Llama 2 layers (h 5120, f 13824, vocab 32000, untied), LoRA on the MLP without checkpointing: in layer
    # 0 q/k/v read the normed input and o_proj the attention of frozen projections, gate/up the residual
    # after it, none requiring grad; down_proj reads act(gate) * up, whose LoRA outputs do. The backward
    # uses the head, the final norm, the whole top layer and layer 0's down_proj (plus its norms).
    from tuneplan.estimator.lora_bottom_layer import bottom_gradient_free
    from tuneplan.estimator.wrappers.zero3_coordinator import zero3_backward_uses, zero3_kept_params

    h, f, v = 5120, 13824, 32000
    cfg = dict(model_type="llama", hidden_size=h, num_hidden_layers=2, num_attention_heads=40,
               num_key_value_heads=40, intermediate_size=f, vocab_size=v, tie_word_embeddings=False)
    spec = model_from_config(cfg, "llama-13b-2L")
    setup = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=False)
    mlp = frozenset({"gate_proj", "up_proj", "down_proj"})
    assert bottom_gradient_free(spec, mlp) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"}
    layer = 4 * h * h + 3 * h * f + 2 * h
    assert zero3_backward_uses(spec, setup, mlp) == v * h + h + layer + (f * h + 2 * h)
    # both layers within stage3_max_reuse_distance of their backward (1e9 - V H >= 2 x layer): kept, less
    # layer 0's six projections, released after their forward
    assert zero3_kept_params(spec, setup, v * h, mlp) == 2 * layer - (4 * h * h + 2 * h * f)
    # LoRA on q/v: o_proj reads the attention (q and v train), the MLP the residual after it
    assert bottom_gradient_free(spec, frozenset({"q_proj", "v_proj"})) == {"q_proj", "k_proj", "v_proj"}
    # a parallel block (GPT-NeoX use_parallel_residual) feeds its MLP from the layer input
    neox = model_from_config(dict(model_type="gpt_neox", hidden_size=1024, num_hidden_layers=2,
                                  num_attention_heads=8, intermediate_size=4096, vocab_size=50432,
                                  use_parallel_residual=True), "neox-2L")
    qkv_only = frozenset({"query_key_value"})
    assert bottom_gradient_free(neox, qkv_only) == {"query_key_value", "dense_h_to_4h", "dense_4h_to_h"}


def test_the_bottom_layers_first_linear_holds_every_round_popped_and_its_round_twice() -> None:
    # Mistral-like, 2 layers (h 4096, 8 KV heads of 128, f 14336, vocab 32000, untied), LoRA on the MLP
    # without checkpointing, rounds of at least 5e7: [E], [q k v o gate] (100,663,296), [up], [down], the
    # same for layer 1, [head]: 8 rounds; PEFT's four wrappers, the embedding, the layer, its norm, its
    # attention and q_proj make 9 fetches, so all of them are popped. The embedding (no backward use) is
    # released after its forward; the q..gate round was waited for: its flat buffer beside the copies.
    from tuneplan.estimator.wrappers.zero3_bottom_forward import zero3_gathered_at_first_linear

    h, kv, f, v = 4096, 1024, 14336, 32000
    cfg = dict(model_type="mistral", hidden_size=h, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, intermediate_size=f, vocab_size=v,
               tie_word_embeddings=False)
    spec = model_from_config(cfg, "mistral-2L")
    setup = build_setup(spec, method="lora", gpus=4, zero=3, gradient_checkpointing=False)
    layer = 2 * h * h + 2 * h * kv + 3 * h * f
    first_round = 2 * h * h + 2 * h * kv + h * f
    mlp = frozenset({"gate_proj", "up_proj", "down_proj"})
    assert zero3_gathered_at_first_linear(spec, setup, 50_000_000, mlp) == (
        2 * v * h + 2 * layer - v * h + first_round)


def test_fused_moe_experts_keep_the_released_layers_stacks_through_their_view() -> None:
    # DeepSeek-V2-Lite widths, 5 layers (the first dense): each MoE layer holds gate_up_proj E x 2f x h and
    # down_proj E x h x f (E 64, f 1408, h 2048), multiplied by grouped_mm as weight.transpose(-2, -1).
    # Freeze with the top 2 layers trainable: layers 3 and 4 save their views; layer 4 stays gathered
    # (stage3_max_reuse_distance), layer 3 is released after its forward and its stacks stay allocated.
    e, f, h = 64, 1408, 2048
    spec = model_from_config(DEEPSEEK_V2_LITE_5L, "deepseek-v2-lite-5L")
    stacks = e * 2 * f * h + e * h * f  # 553,648,128
    freeze = build_setup(spec, method="freeze", gpus=2, zero=3, gradient_checkpointing=False)
    assert zero3_view_kept(spec, freeze, frozenset(), 1, holds_all=False) == stacks
    # a full fine-tune saves the views of every MoE layer released (1, 2, 3), the dense layer has none
    full = build_setup(spec, method="full", gpus=2, zero=3, gradient_checkpointing=False)
    assert zero3_view_kept(spec, full, frozenset(), 1, holds_all=False) == 3 * stacks
    # LoRA on the shared experts' gate: every MoE layer lies above a target (layer 0 is dense)
    lora = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=False)
    assert zero3_view_kept(spec, lora, frozenset({"gate_proj"}), 1, holds_all=False) == 3 * stacks


def test_the_first_pass_embedding_round_waited_in_the_bottom_layer() -> None:
    # Qwen3 (h 4096, 32 heads of 128, 8 KV heads, f 12288, vocab 151936) at 4 layers with a 2-label head,
    # freeze with checkpointing (the embedding's output requires grad: its backward use is the last).
    # Per layer q 16,777,216, k and v 4,194,304, o 16,777,216, gate/up/down 50,331,648 each: the forward
    # trace's 50e6-element rounds are [E], [q k v o gate] (4.19e7 < 5e7 before gate), [up], [down] per
    # layer and [head]: 1 + 4 x 3 + 1 = 14, so the embedding's backward round is popped at fetch 15,
    # after the bottom layer's q_proj (the 7th fetch: the two model wrappers, the embedding, the layer,
    # its input norm, its attention, q_proj) has been released: the round is layer 0's released linears
    # and the embedding, waited for at layer 0's recompute, beside the layer and the embedding's copy.
    h, f, v = 4096, 12288, 151936
    cfg = dict(model_type="qwen3", hidden_size=h, num_hidden_layers=4, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, intermediate_size=f, vocab_size=v,
               tie_word_embeddings=False)
    spec = model_as_built(model_from_config(cfg, "qwen3-4L"), "hf", 2)
    setup = build_setup(spec, method="freeze", gpus=2, zero=3, gradient_checkpointing=True, num_labels=2)
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * h * f + 2 * h + 2 * 128  # linears, 2 norms, q/k norms
    assert zero3_first_pass_round(spec, setup, 50_000_000) == (0, layer + 2 * v * h)
    # the GPT-NeoX-like 2-layer stand-in of the test above (qkv 5.03e7, dense 1.68e7, up and down 6.71e7):
    # rounds [E], [qkv], [dense up], [down] twice, [head]: 8, popped at fetch 9, before the bottom layer's
    # query_key_value (fetch 10 under PEFT: four wrappers, embedding, layer, norm, attention, the LoRA
    # linear and its base layer): the round of the final norm and the head, held from the forward (two
    # micro-batches per step: the norm and the head not yet gathered again by a step)
    neox = dict(model_type="gpt_neox", hidden_size=h, num_hidden_layers=2, num_attention_heads=32,
                intermediate_size=4 * h, vocab_size=50688, tie_word_embeddings=False)
    small = model_as_built(model_from_config(neox, "neox-2L"), "hf", 2)
    lora = build_setup(small, method="lora", gpus=4, zero=3, gradient_checkpointing=True, num_labels=2,
                       grad_accum=2)
    assert zero3_first_pass_round(small, lora, 50_000_000, frozenset({"query_key_value"})) == (50688 * h, 0)


def test_a_later_bottom_linear_holds_one_more_round_and_its_own_round_twice() -> None:
    # GPT-NeoX (stablelm-base-alpha-3b widths: h 4096, f 16384, vocab 50688, biased linears, parallel
    # residual), 3 layers, a 2-label head, LoRA on the MLP without checkpointing. Per layer qkv 50,343,936,
    # dense 16,781,312, up 67,125,248, down 67,112,960; rounds of 5e7: [E], [qkv], [dense up], [down] per
    # layer, [head]: 11. At qkv (fetch 10: four wrappers, the embedding, the model-level rotary_emb, the
    # layer, its norm, its attention, qkv) 10 rounds are popped, the embedding released. At dense (fetch
    # 11) the head's round too (2 x 4096), qkv (no backward use) released after its forward, and dense's
    # round [dense up] waited for: its flat buffer beside the copies (simulate: 6.418e8 elements at layer
    # 0's dense, its LoRA matrices among the rounds).
    from tuneplan.estimator.wrappers.zero3_bottom_forward import zero3_gathered_at_first_linear

    h, f, v = 4096, 16384, 50688
    cfg = dict(model_type="gpt_neox", hidden_size=h, num_hidden_layers=3, num_attention_heads=32,
               intermediate_size=f, vocab_size=v, tie_word_embeddings=False, use_parallel_residual=True)
    spec = model_as_built(model_from_config(cfg, "neox-3L"), "hf", 2)
    setup = build_setup(spec, method="lora", gpus=4, zero=3, gradient_checkpointing=False, num_labels=2)
    qkv, dense, up, down = h * 3 * h + 3 * h, h * h + h, h * f + f, f * h + h
    layer = qkv + dense + up + down
    mlp = frozenset({"dense_h_to_4h", "dense_4h_to_h"})
    assert zero3_gathered_at_first_linear(spec, setup, 50_000_000, mlp) == (
        3 * layer + 2 * h - qkv + dense + up)


def test_lora_adapted_expert_stacks_save_the_parametrized_copy_not_a_view() -> None:
    # PEFT's lora.ParamWrapper on a fused stack (peft/tuners/lora/layer.py ``_activate_lora``): the
    # parametrization ``_LoraFactorsProxy.forward`` returns ``torch.baddbmm(W, lhs, rhs)``, a new tensor;
    # grouped_mm saves the transposed view of that tensor, baddbmm saves its factors. The gathered W is
    # kept by nothing once DeepSpeed releases it. DeepSeek-V2-Lite widths, 5 layers (the first dense).
    e, f, h = 64, 1408, 2048
    spec = model_from_config(DEEPSEEK_V2_LITE_5L, "deepseek-v2-lite-5L")
    lora = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=False)
    both = frozenset({"experts@gate_up_proj", "experts@down_proj"})
    assert zero3_view_kept(spec, lora, both, 1, holds_all=False) == 0
    # only down_proj adapted: gate_up_proj [E, 2f, h] is still multiplied as a view of the gathered
    # parameter in the three released MoE layers (1, 2, 3)
    down = frozenset({"experts@down_proj"})
    assert zero3_view_kept(spec, lora, down, 1, holds_all=False) == 3 * e * 2 * f * h


def test_the_bottom_views_of_a_stalled_prefetcher_keep_a_released_copy_beside_the_regathered_one() -> None:
    # falcon-7b over 4 layers (tied), LoRA r 16 on the MLP without checkpointing over 8 GPUs: E = 65,024 x
    # 4,544 = 295,469,056; a layer: query_key_value 4,544 x 4,672 = 21,229,568, dense 4,544^2 = 20,647,936,
    # dense_h_to_4h and dense_4h_to_h 4,544 x 18,176 = 82,591,744, the input norm's weight and bias 9,088:
    # 207,070,080. At the loss the prefetcher holds every parameter with a backward use, but through the
    # forward E + 4 layers = 1,123,749,376 >= M: it stalls before the backward's entries, the bottom layer's
    # the last, so layer 0's dense_4h_to_h (its input requires grad through dense_h_to_4h's LoRA output:
    # its weight.T view is saved) is released after its forward and popped again at once: the released copy
    # beside the new one, 82,591,744. With two micro-batches a step, the first complete pass's regather
    # round holds the persistent tail the record pass released (the top layer's dense_4h_to_h lora_B
    # 4,544 x 16 = 72,704 and ln_f), coalesced: its flat buffer too, 2 x 82,591,744 in all.
    # (simulate: seed 97 r240, the 82,673,536-element flat buffer popped at layer 0's dense_4h_to_h
    # lora_dropout beside eight 82,591,744 copies at the loss.)
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.run import resolve_run
    from tuneplan.estimator.wrappers.zero3_saved_views import zero3_views_kept

    base = resolve_model("tiiuae/falcon-7b", allow_network=False)
    fields = dict(method="lora", precision="fp16-mixed", gpus=8, zero=3, rank=16, targets="mlp",
                  gradient_checkpointing=False)
    for layers, accum, kept in ((4, 2, 2 * 82_591_744), (4, 1, 82_591_744), (2, 2, 0)):
        spec = model_from_config(dict(base.config, num_hidden_layers=layers), f"falcon-7b-{layers}L")
        assert spec.embed_params == 295_469_056
        assert spec.layer_groups[0][0].linear_params + spec.layer_groups[0][0].norm_params == 207_070_080
        run = resolve_run(spec, build_setup(spec, grad_accum=accum, **fields))
        # two layers: E + 414,140,160 < M, the prefetcher passes layer 0's backward uses before its forward
        assert zero3_views_kept(run, spec.embed_params, 50_000_000) == kept


def test_the_lower_layers_expert_copies_kept_by_saved_views_are_live_at_the_top_layers_forward() -> None:
    # Qwen2-57B-A14B over 3 layers, full fine-tune in bf16 without checkpointing over 4 GPUs. Each layer's
    # fused experts: gate_up_proj 64 x 5120 x 3584 = 1,174,405,120, down_proj 64 x 3584 x 2560 =
    # 587,202,560 elements. The experts' input requires grad (full), so grouped_mm saves a view of each
    # gathered stack; DeepSpeed's release of layers 0 and 1 (their next use past
    # stage3_max_reuse_distance) leaves the copies alive. The top layer's leaf MoE block is kept (its
    # release's recursive walk meets the model's backward fetch, which holds it, after the head) and its own
    # stacks are in its round: at its forward, 2 x 1,761,607,680 = 3,523,215,360 elements beside it.
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.run import resolve_run
    from tuneplan.estimator.wrappers.zero3_saved_views import zero3_views_below_top

    base = resolve_model("Qwen/Qwen2-57B-A14B", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=3), "qwen2-57b-a14b-3L")
    setup = build_setup(spec, method="full", precision="bf16", gpus=4, zero=3, framework="llamafactory",
                        gradient_checkpointing=False, batch=3, seq=64)
    run = resolve_run(spec, setup)
    assert zero3_views_below_top(run, spec.lm_head_params, 50_000_000) == 2 * (1_174_405_120 + 587_202_560)
