"""The backward orders and bucket fills are made once per frozen spec (reduce_buckets.py lru caches): what a
caller gets is its own list, so changing it changes nothing a later formula reads.

Hand count: a bucket of 10 elements over the gradients [4, 5, 3, 8, 2] (DeepSpeed's
``reduce_independent_p_g_buckets_and_remove_grads``: a gradient that would take the bucket past the size
reduces what it holds first): 4 + 5 = 9 fits, 9 + 3 = 12 does not -> [4, 5]; 3 + 8 = 11 does not -> [3];
8 + 2 = 10 fits -> [8, 2] (the epilogue's)."""

from __future__ import annotations

from tuneplan.estimator.wrappers.reduce_buckets import (
    backward_turn_gradients,
    backward_turns,
    bucket_fills,
    bucket_members,
    full_backward_gradients,
)
from tuneplan.estimator.wrappers.zero3_coordinator import forward_trace, prefetch_rounds
from tuneplan.specs.model import model_from_config

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 100,
          "tie_word_embeddings": False}


def test_bucket_members_by_hand_and_fresh_lists() -> None:
    members = bucket_members([4, 5, 3, 8, 2], 10)
    assert members == [[4, 5], [3], [8, 2]]
    assert bucket_fills((4, 5, 3, 8, 2), 10) == [9, 3, 10]
    members[0].append(99)
    members.append([1])
    assert bucket_members([4, 5, 3, 8, 2], 10) == [[4, 5], [3], [8, 2]]


def test_backward_orders_are_fresh_lists_of_the_cached_order() -> None:
    model = model_from_config(CONFIG)
    order = full_backward_gradients(model, embedding=False)
    # the head (100 x 64), the final norm (64), then each layer: down, up, gate, o, v, k, q, its norms
    layer = [128 * 64, 64 * 128, 64 * 128, 64 * 64, 64 * 64, 64 * 64, 64 * 64, 2 * 64]
    assert order == [100 * 64, 64, *layer, *layer]
    order.clear()
    assert full_backward_gradients(model, embedding=False) == [100 * 64, 64, *layer, *layer]
    # the ZeRO-3 turns of a full fine-tune without leaf MoE blocks: each gradient alone at its turn
    assert backward_turns(model, True, 2, False) == tuple((n, n) for n in [100 * 64, 64, *layer, *layer])
    assert backward_turn_gradients(model, True, 2, False) == (100 * 64, 64, *layer, *layer)
    assert backward_turns(model, False, 0, False) == ()


def test_forward_trace_and_rounds() -> None:
    model = model_from_config(CONFIG)
    # the embedding, each layer's q, k, v, o, gate, up, down weights, the head
    layer = (64 * 64,) * 4 + (64 * 128,) * 3
    assert forward_trace(model) == (100 * 64, *layer, *layer, 100 * 64)
    # rounds of at least 10,000 elements: 6400 + 4096 = 10,496; 4096 x 3 = 12,288; 8192 + 8192 = 16,384; ...
    rounds = prefetch_rounds(forward_trace(model), 10_000)
    assert rounds[:3] == [[6400, 4096], [4096, 4096, 4096], [8192, 8192]]
    assert sum(map(len, rounds)) == len(forward_trace(model))
