"""ZeRO-2's reductions in the layers placed in the backward (wrappers/zero2_partition.py ``records``,
wrapper_rows.zero2_reduction_rows), by hand from DeepSpeed 0.19.8's stage_1_and_2.py on a two-layer
Mistral-7B-v0.2 (hidden 4096, 8 KV heads, MLP 14336, vocab 32000, untied) fully fine-tuned in bf16 over 2
GPUs under checkpointing, 3 x 2048 tokens (simulate: held-103 r42, the reduction that makes rank 0's
partition comes at layer 0's gate_proj hook, its ``cat`` of 466,628,608 elements, the layer's MLP
tensors released; the 731,922,432-byte ``grads_in_partition`` is made after it, inside the bottom layer).

Elements: embedding and lm_head 131,072,000 each; per layer q and o 16,777,216, k and v 4,194,304, gate,
up and down 58,720,256, the norms 8,192 (218,112,000); the final norm 4,096: 698,372,096 in all, a
partition of 349,186,048. Hooks: lm_head, the final norm, layer 1's down .. q and norms (the bucket at
349,188,096), layer 0's down and up (466,628,608), then gate_proj would pass 5e8: the bucket is reduced,
its slices copied whole, beside gate_proj's own gradient:

    (58,720,256 + 466,628,608) x 2 bytes = 1,050,697,728

Rank 0's partition covers the embedding, layer 0 and the start of layer 1's q_proj, whose gradient the
reduction holds: it makes ``grads_in_partition`` of every tensor overlapping it,
(131,072,000 + 218,112,000 + 16,777,216) x 2 = 731,922,432 bytes, past layer 0's MLP block."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.instants import memory_at
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero2_partition import LayersBackward, gradient_walk, layers_backward_moment
from tuneplan.specs.model import model_from_config

MISTRAL_2L = {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
              "tie_word_embeddings": False}
BUCKET = 500_000_000
PARTITION_BYTES = 2 * (131_072_000 + 218_112_000 + 16_777_216)


def run():  # type: ignore[no-untyped-def]
    model = model_from_config(MISTRAL_2L, "Mistral-7B-v0.2 2 layers (hand config)")
    setup = build_setup(model, method="full", precision="bf16", optimizer="adamw-hf", gpus=2, zero=2,
                        gradient_checkpointing=True, batch=3, seq=2048)
    return resolve_run(model, setup)


def test_the_partition_is_made_past_the_bottom_layers_mlp() -> None:
    assert PARTITION_BYTES == 731_922_432
    # records in hook order, the head's gradients apart (262,144,000 bytes: the lm_head's): layer 1's
    # down_proj (117,440,512 bytes, its MLP not back-propagated yet, no layer above), then the reduction at
    # layer 0's gate_proj, one layer above, past its MLP block
    walk = layers_backward_moment(run(), BUCKET, PARTITION_BYTES)
    assert walk == LayersBackward(1_050_697_728, True, 262_144_000,
                                  ((117_440_512, 0, False), (1_050_697_728, 1, True)), True)


def test_the_bottom_row_lacks_the_partition_made_past_its_mlp() -> None:
    resolved = run()
    statics = memory_statics(resolved)
    assert statics.wrapped.partition_at_bottom == PARTITION_BYTES
    live = memory_at(resolved, 3, 2048)
    acts, rows = live.acts, live.rows
    bucket = 2 * BUCKET
    bottom = rows["backward_layers_bottom"]
    assert bottom[0] == bucket  # the layer's start: its recomputation and scratch whole, no partition yet
    past = rows["backward_bottom_past_mlp"]
    assert past[0] == bucket + PARTITION_BYTES
    assert past[2] == bottom[2] - acts.mlp_saved_bytes and past[5] == bottom[5]
    # the reduction: the bucket, its copy and gate_proj's gradient beside the checkpoints and the recomputed
    # layer without its MLP block's saved tensors, the scratch its input's gradients (h x (2 + 2 x 2) bytes
    # a token: the layer output's gradient, gate's and up's input gradients)
    reduction = rows["backward_reductions"]
    assert reduction[0] == bucket + 1_050_697_728
    assert reduction[2] == acts.saved_bytes - acts.tail_bytes + acts.recompute_bytes - acts.mlp_saved_bytes
    assert reduction[5] == 3 * 2048 * 4096 * 6
    assert rows["backward_reductions_1"][:3] == (bucket + 117_440_512, 0,
                                                 acts.saved_bytes - acts.tail_bytes + acts.recompute_bytes)


def test_the_walk_is_kept_per_model_and_sharding_not_per_batch_shape() -> None:
    # the walk reads the model, the method, the partition (698,372,096 / 2), the compute bytes, the bucket
    # and P, never the batch or the sequence: another batch shape of the same model reuses it
    model = model_from_config(MISTRAL_2L, "Mistral-7B-v0.2 2 layers (hand config)")
    first = layers_backward_moment(run(), BUCKET, PARTITION_BYTES)
    hits = gradient_walk.cache_info().hits
    setup = build_setup(model, method="full", precision="bf16", optimizer="adamw-hf", gpus=2, zero=2,
                        gradient_checkpointing=True, batch=1, seq=512)
    assert layers_backward_moment(resolve_run(model, setup), BUCKET, PARTITION_BYTES) == first
    assert gradient_walk.cache_info().hits == hits + 1
