"""deploy/serving.py: the engine's activation floor, sampler and workspaces beside weights and KV cache."""

from __future__ import annotations

import pytest

from tests.conftest import TINY_LLAMA
from tuneplan.deploy.serving import CUDA_GRAPHS, activation_per_token, overheads
from tuneplan.estimator.overhead import CUBLAS_WORKSPACE
from tuneplan.specs.model import model_from_config


@pytest.fixture
def tiny():
    return model_from_config(TINY_LLAMA, "tiny")  # h 256, 8 heads x 32, 2 KV heads, intermediate 688


def test_activation_per_token_by_hand(tiny):
    # attention: residual + normed input 2 x 256 = 512, plus q 256, k and v 2 x 64, output 8 x 32 = 256:
    #   512 + 640 = 1,152; gated MLP: 512 + 3 x 688 = 2,576 (wider); 2 bytes each -> 5,152
    assert activation_per_token(tiny, 1) == 5_152


def test_tensor_parallelism_divides_only_the_sharded_widths(tiny):
    # tp 2: attention 512 + 320 = 832; MLP 512 + 2,064 / 2 = 1,544; 2 bytes -> 3,088
    assert activation_per_token(tiny, 2) == 3_088
    # the residual 2 h stays whole however many ranks: the floor is 2 x 2 h bytes
    assert activation_per_token(tiny, 1024) >= 2 * 2 * 256


def test_overheads_by_hand(tiny):
    o = overheads(tiny, tp=1, prefill_tokens=2048, concurrency=4)
    # sampler: 4 sequences x vocab 1,000 x 4 B (fp32) x 2 (logits and probabilities) = 32,000
    assert o.sampler == 32_000
    assert o.activation_per_token == 5_152
    assert o.activations == 2048 * 5_152 + 32_000
    assert o.cublas == CUBLAS_WORKSPACE == 32 * 2**20
    assert o.cuda_graphs == CUDA_GRAPHS
    assert o.workspace == o.cuda_context + o.cublas + o.cuda_graphs


def test_eager_mode_has_no_graph_pool(tiny):
    eager = overheads(tiny, tp=1, prefill_tokens=2048, concurrency=4, cuda_graphs=False)
    graphs = overheads(tiny, tp=1, prefill_tokens=2048, concurrency=4)
    assert eager.cuda_graphs == 0
    assert graphs.workspace - eager.workspace == CUDA_GRAPHS


def test_activations_grow_with_prefill_and_concurrency(tiny):
    base = overheads(tiny, tp=1, prefill_tokens=512, concurrency=1).activations
    assert overheads(tiny, tp=1, prefill_tokens=1024, concurrency=1).activations > base
    assert overheads(tiny, tp=1, prefill_tokens=512, concurrency=2).activations > base


def test_a_gelu_mlp_keeps_two_intermediate_widths():
    # GPT-2 small: h 768, 12 heads x 64, intermediate 4 h = 3,072. Attention 2 x 768 + (768 + 2 x 768 + 768)
    # = 4,608; the GELU MLP 2 x 768 + 2 x 3,072 = 7,680 (wider); 2 bytes -> 15,360
    gpt2 = model_from_config(dict(model_type="gpt2", n_embd=768, n_layer=2, n_head=12, vocab_size=1000,
                                  n_positions=1024), "gpt2-small")
    assert activation_per_token(gpt2, 1) == 15_360


def test_a_moe_layer_counts_the_routed_experts_widths():
    # Mixtral-shaped: h 64, 2 of 4 experts of width 128 per token: MLP 2 x 64 + 3 x (2 x 128) = 896,
    # attention 128 + (64 + 2 x 32 + 64) = 320; 2 bytes -> 1,792
    cfg = dict(model_type="mixtral", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2,
               vocab_size=100)
    moe = model_from_config(cfg, "tiny-mixtral")
    assert activation_per_token(moe, 1) == 1_792
