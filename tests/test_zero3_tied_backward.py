"""ZeRO-3 around a tied head, the token embedding's weight (estimator/wrappers/zero3_tied_backward.py),
counted by hand with DeepSpeed's defaults ``stage3_max_live_parameters`` M = ``stage3_max_reuse_distance``
D = 1e9 elements and a prefetch bucket of 5e7."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.wrappers.zero3_coordinator import zero3_gathered_ahead
from tuneplan.estimator.wrappers.zero3_tied_backward import (
    tied_embedding_released_in_backward,
    zero3_tied_regathered,
)
from tuneplan.specs.model import model_from_config

BUCKET = 50_000_000
ALL = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
# gemma-7b's widths, tied: E = 256000 x 3072 = 786,432,000; a layer's linears 4 x 3072 x 4096 = 50,331,648
# and 3 x 3072 x 24576 = 226,492,416, 276,824,064 in all, its two norms 6,144
GEMMA7 = dict(model_type="llama", hidden_size=3072, num_hidden_layers=2, num_attention_heads=16,
              num_key_value_heads=16, head_dim=256, intermediate_size=24576, vocab_size=256_000,
              tie_word_embeddings=True)
# gemma-3-12b's widths, tied: E = 262208 x 3840 = 1,006,878,720 (over M); a layer's linears
# 2 x 3840 x 4096 + 2 x 3840 x 2048 + 3 x 3840 x 15360 = 224,133,120, its two norms 7,680
GEMMA12 = dict(model_type="llama", hidden_size=3840, num_hidden_layers=4, num_attention_heads=16,
               num_key_value_heads=8, head_dim=256, intermediate_size=15360, vocab_size=262_208,
               tie_word_embeddings=True)


def test_tied_embedding_at_the_loss_is_counted_live() -> None:
    spec = model_from_config(GEMMA7, "gemma7-2")
    setup = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=True)
    # every parameter has a backward use: 786,432,000 + 2 x 276,830,208 + 3,072 = 1,340,095,488; the
    # layers (5.5e8) fit under M, but the embedding, the head's weight, is already AVAILABLE at the loss:
    # the crossing round is a layer's, M plus the largest layer parameter (an MLP weight, 75,497,472)
    assert zero3_gathered_ahead(spec, setup, BUCKET, ALL) == 1_000_000_000 + 75_497_472


def test_tied_embedding_released_after_the_heads_backward() -> None:
    spec = model_from_config(GEMMA12, "gemma12-4")
    lora = build_setup(spec, method="lora", gpus=8, zero=3, gradient_checkpointing=True)
    # E >= M held through the forward (the layers, 4 x 224,140,800 + 3,840 = 896,567,040 < D, lie between
    # its two uses); from the head's backward, each layer's recompute and backward: 1.793e9 >= D, released
    assert tied_embedding_released_in_backward(spec, lora)
    # the prefetcher then runs ahead to the embedding: the four layers (896,563,200 < M) and E, in the top
    # layer already, whose first round q, k, v, o (47,185,920 < 5e7) and gate (58,982,400), 106,168,320 in
    # all, is held twice (its flat buffer and the copies)
    assert zero3_tied_regathered(spec, lora, BUCKET, ALL) == 896_563_200 + 1_006_878_720 + 106_168_320
    # no recompute in a full fine-tune without checkpointing: 896,567,040 < D keeps the embedding
    full = build_setup(spec, method="full", gpus=8, zero=3, gradient_checkpointing=False)
    assert not tied_embedding_released_in_backward(spec, full)
    assert zero3_tied_regathered(spec, full, BUCKET, ALL) == 0
    # LoRA without checkpointing: the embedding has no backward use at all (embedding_used_last)
    plain = build_setup(spec, method="lora", gpus=8, zero=3, gradient_checkpointing=False)
    assert zero3_tied_regathered(spec, plain, BUCKET, ALL) == 0


def test_the_embeddings_coalesced_round_is_held_twice_through_the_bottom_layer() -> None:
    # gemma-2-9b widths, 4 layers, tied, LoRA r 32 on the MLP with checkpointing: E = 256,000 x 3,584 =
    # 917,504,000; a layer's linears q and o 3,584 x 4,096 = 14,680,064, k and v 3,584 x 2,048 =
    # 7,340,032, gate, up, down 3,584 x 14,336 = 51,380,224 (198,180,864) and four norms (14,336):
    # P - E = 4 x 198,195,200 + 3,584, twice (recompute and backward) >= D, so the head's backward
    # releases the embedding; the four layers are under M, the prefetcher pops it again. The bottom
    # layer's recompute queues, in forward order, q, k, v, o, then per MLP linear lora_A, the weight
    # (>= the 5e7 bucket: it closes its round), lora_B: after down_proj's weight only its lora_B
    # (3,584 x 32 = 114,688) opens the embedding's round, coalesced: 114,688 + 917,504,000 gathered into
    # one flat buffer, the embedding's copy made at lora_B's fetch. G = 198,195,200 + 2 E + 114,688.
    # (simulate: the 917,618,688-element buffer beside the 917,504,000 copy through layer 0's backward.)
    from tuneplan.estimator.wrappers.zero3_lower_layers import zero3_embedding_round_held_twice

    cfg = dict(model_type="gemma2", hidden_size=3584, num_hidden_layers=4, num_attention_heads=16,
               num_key_value_heads=8, head_dim=256, intermediate_size=14336, vocab_size=256_000)
    spec = model_from_config(cfg, "gemma-2-9b-4L")
    e = 256_000 * 3584
    assert spec.embed_params == e and not spec.lm_head_params
    assert spec.layer_groups[0][0].linear_params + spec.layer_groups[0][0].norm_params == 198_195_200
    mlp = frozenset({"gate_proj", "up_proj", "down_proj"})
    ckpt = build_setup(spec, method="lora", gpus=4, zero=3, gradient_checkpointing=True, rank=32)
    assert zero3_embedding_round_held_twice(spec, ckpt, mlp, BUCKET) == 198_195_200 + 2 * e + 114_688
    # LoRA on the attention only: down_proj's weight is the bottom layer's last queued, alone in its
    # round, and the embedding opens its own: no copy beside a buffer
    attn = frozenset({"q_proj", "k_proj", "v_proj", "o_proj"})
    assert zero3_embedding_round_held_twice(spec, ckpt, attn, BUCKET) == 0


def test_an_embedding_over_the_live_limit_is_held_twice_in_the_bottom_layer_once_released() -> None:
    # gemma-3-27b widths, 2 layers, tied, LoRA r 32 on the MLP with checkpointing over 8 GPUs in bf16:
    # E = 262,208 x 5,376 = 1,409,630,208 >= M, so it fills stage3_max_live_parameters through the forward
    # and the forward's prefetcher never runs ahead. A layer: q and o 5,376 x 4,096 = 22,020,096, k and v
    # 5,376 x 2,048 = 11,010,048, gate, up, down 5,376 x 21,504 = 115,605,504, four norms 4 x 5,376 and
    # q/k norms 2 x 128: 412,898,560. P - E = 2 x 412,898,560 + 5,376 (the final norm), twice (recompute
    # and backward) >= D = 1e9, so the head's backward releases the embedding and the
    # backward's prefetcher pops it again (the two layers, 825,797,120, under M). The bottom layer's
    # recompute queues down_proj's weight (>= the 5e7 bucket, closing its round) then its lora_B, 5,376 x 32
    # = 172,032, which opens the embedding's round: one flat buffer of 172,032 + E, and the embedding's
    # copy made at lora_B's fetch (AllGatherCoalescedHandle.wait), both through layer 0's backward:
    # G = 412,898,560 + 2 E + 172,032 = 3,232,331,008 elements, 2 B each.
    # (simulate: seed 103 r10, the 1,409,802,240-element buffer made at layer 1's recomputed v_proj beside
    # the 1,409,630,208 copy made at layer 0's down_proj lora_B, the peak in layer 0's backward.)
    from tuneplan.estimator.optimizer import OptimizerPlan
    from tuneplan.estimator.run import resolve_run

    cfg = dict(model_type="gemma3_text", hidden_size=5376, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=16, head_dim=128, intermediate_size=21504, vocab_size=262_208)
    spec = model_from_config(cfg, "gemma-3-27b-2L")
    assert spec.embed_params == 1_409_630_208 and not spec.lm_head_params
    setup = build_setup(spec, method="lora", gpus=8, zero=3, gradient_checkpointing=True, rank=32,
                        precision="bf16-mixed", targets="mlp")
    run = resolve_run(spec, setup)
    assert zero3_gathered_ahead(spec, setup, BUCKET, run.targets) == 0
    assert tied_embedding_released_in_backward(spec, setup)
    gathered = run.wrapper.memory(run, OptimizerPlan(0, 0, 0)).gathered
    assert gathered.in_layers == (412_898_560 + 2 * 1_409_630_208 + 172_032) * 2
