"""Shared fixtures: small hand-written configs (independent of the catalog)."""

from __future__ import annotations

import pytest

QWEN25_7B = dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False)
LLAMA2_7B = dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False)
TINY_LLAMA = dict(model_type="llama", hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, intermediate_size=688, vocab_size=1000, tie_word_embeddings=False)


@pytest.fixture
def qwen7b():
    from tuneplan.specs.model import model_from_config

    return model_from_config(QWEN25_7B, "Qwen2.5-7B (hand config)")


@pytest.fixture
def tiny_llama():
    from tuneplan.specs.model import model_from_config

    return model_from_config(TINY_LLAMA, "tiny-llama")
