"""Config dropouts (specs/dropouts.py), and the embedding backward's gradient and scratch bytes
(estimator/saved_tensors.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import TINY_LLAMA
from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.saved_tensors import (
    embedding_backward,
    embedding_backward_at,
    embedding_backward_scratch,
)
from tuneplan.specs.dropouts import model_dropout
from tuneplan.specs.model import model_from_config
from tuneplan.specs.setup import TrainSetup

# bf16 everywhere: trainable params (and so the embedding gradient) 2 bytes
BF16 = Dtypes(compute=2, autocast=False, frozen_weight=2, trainable=2, adapter=2, non_block=2, residual=2,
              norm_out=2, linear_out=2, quant_out=2)


@pytest.mark.parametrize("cfg, expected", [
    # GPT-2 style: attn_pdrop / resid_pdrop / embd_pdrop
    ({"attn_pdrop": 0.1, "resid_pdrop": 0.2, "embd_pdrop": 0.3}, (0.1, 0.2, 0.3)),
    # BERT: the embedding dropout is hidden_dropout_prob (BertEmbeddings uses it)
    ({"attention_probs_dropout_prob": 0.1, "hidden_dropout_prob": 0.2}, (0.1, 0.2, 0.2)),
    # Llama-style configs ship attention_dropout 0.0 and nothing else
    ({"attention_dropout": 0.0}, (0.0, 0.0, 0.0)),
    ({}, (0.0, 0.0, 0.0)),
    # a bool is not a probability; a string neither
    ({"attn_pdrop": True, "resid_pdrop": "0.1"}, (0.0, 0.0, 0.0)),
])
def test_model_dropout(cfg, expected):
    assert model_dropout(cfg) == expected


def test_embedding_backward_scratch_by_hand():
    # two int64 index copies + int64 offsets per token (3 * 8 = 24 B) + fp32 [tokens, hidden] partial sums:
    # 512 tokens, hidden 256: 24 * 512 + 4 * 512 * 256 = 12,288 + 524,288
    assert embedding_backward_scratch(512, 256) == 536_576


def test_embedding_backward_is_nothing_without_a_trainable_embedding():
    model = model_from_config(TINY_LLAMA, "tiny")
    for method in ("lora", "qlora", "freeze"):
        assert embedding_backward_at(model, method, BF16, 512) == (0, 0)


def test_embedding_backward_untied_by_hand():
    model = model_from_config(TINY_LLAMA, "tiny")  # vocab 1000, hidden 256, untied
    grad, during = embedding_backward_at(model, "full", BF16, 512)
    assert grad == 1000 * 256 * 2  # 512,000: the dense gradient in the param dtype
    # scratch 536,576 + the incoming gradient of the embedding output 512 * 256 * 2 = 262,144
    assert during == 536_576 + 262_144


def test_embedding_backward_tied_keeps_two_contributions_and_their_sum():
    model = model_from_config({**TINY_LLAMA, "tie_word_embeddings": True}, "tiny-tied")
    grad = 512_000
    # 512 tokens: during = 798,720; grad + during = 1,310,720 > 2 * grad = 1,024,000
    assert embedding_backward_at(model, "full", BF16, 512) == (grad, grad + 798_720)
    # 1 token: during = 24 + 1,024 + 512 = 1,560; grad + during < 2 * grad: the InputBuffer sum wins
    assert embedding_backward_at(model, "full", BF16, 1) == (grad, 2 * grad)


def test_embedding_backward_on_a_grid_matches_each_scalar():
    model = model_from_config({**TINY_LLAMA, "tie_word_embeddings": True}, "tiny-tied")
    tokens = np.array([1, 64, 512, 4096])
    grad, during = embedding_backward_at(model, "full", BF16, tokens)
    assert list(during) == [embedding_backward_at(model, "full", BF16, int(t))[1] for t in tokens]
    assert grad == 512_000


def test_embedding_backward_reads_the_setups_tokens():
    model = model_from_config(TINY_LLAMA, "tiny")
    setup = TrainSetup(method="full", batch=4, seq=128)
    assert embedding_backward(model, setup, BF16) == embedding_backward_at(model, "full", BF16, 4 * 128)


def test_embedding_backward_grows_with_tokens():
    model = model_from_config(TINY_LLAMA, "tiny")
    during = [embedding_backward_at(model, "full", BF16, t)[1] for t in (1, 10, 100, 1000)]
    assert during == sorted(during) and len(set(during)) == 4
