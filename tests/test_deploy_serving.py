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
