"""A standard decoder family scaled by size, for "the largest model that fits" beyond the catalog.

Shape rules (Llama 3 style, checked against the published configs of Llama-3-8B and Llama-3-70B):
- head_dim 128, hidden = 128 x s (s attention heads); Llama 3 8B: 4096 = 128 x 32, 70B: 8192 = 128 x 64;
- grouped-query attention with 8 key/value heads, as every Llama 3, where 8 divides the heads; else the
  largest common divisor of the heads and 8 (transformers' attention shares each key/value head by an
  equal number of query heads: ``repeat_kv`` needs a divisor, and the config check refuses others);
- SwiGLU MLP, intermediate = 3.5 x hidden rounded up to a multiple of 256 (14336 = 3.5 x 4096,
  28672 = 3.5 x 8192);
- layers = s, i.e. hidden / layers = 128 (Llama 3 8B: 4096 / 32 = 128; Llama 2 13B: 5120 / 40 = 128);
- vocabulary 128256 (the Llama 3 tokenizer), untied lm_head, RMSNorm, 131072 positions.
With s = 32 this is exactly Llama-3-8B (8,030,261,248 parameters).

The family is a staircase indexed by an integer ``i``: ``s = i // 2 + 1`` heads/layers, plus one more
layer on odd ``i``. Hidden size, layers and intermediate size never decrease along it; the key/value heads
may fall from one size to the next (8 at 32 heads, 1 at 33), but what they take away per layer
(2 x hidden x 7 x 128 projection weights at most) is less than what the next head adds (the MLP's
3 x 3.5 x 128 x 2 x hidden and the query/output projections' 4 x 128 x hidden), so every memory term
stays non-decreasing in ``i`` and "fits" is monotone (tests/test_plan_max_model.py checks it over the
family): bisection over ``i`` is exact. Consecutive sizes differ by about 3-6% near 8B.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from tuneplan.specs.model import ModelSpec, model_from_config

HEAD_DIM = 128
KV_HEADS = 8
FFN_MULT = 3.5
FFN_ROUND = 256
VOCAB = 128256
MAX_POSITION = 131072
MAX_INDEX = 2 * 1024 - 1  # s up to 1024: hidden 131072, far beyond any card


def shape(i: int) -> dict[str, int]:
    s = i // 2 + 1
    hidden = HEAD_DIM * s
    inter = -(-int(FFN_MULT * hidden) // FFN_ROUND) * FFN_ROUND
    return {"hidden": hidden, "layers": s + (i % 2), "heads": s, "kv_heads": math.gcd(KV_HEADS, s),
            "intermediate": inter, "vocab": VOCAB}


def config(i: int) -> dict[str, Any]:
    sh = shape(i)
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": sh["hidden"], "num_hidden_layers": sh["layers"], "num_attention_heads": sh["heads"],
        "num_key_value_heads": sh["kv_heads"], "head_dim": HEAD_DIM, "intermediate_size": sh["intermediate"],
        "vocab_size": VOCAB, "tie_word_embeddings": False, "max_position_embeddings": MAX_POSITION,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    }


@lru_cache(maxsize=4096)
def standard_model(i: int) -> ModelSpec:
    sh = shape(i)
    return model_from_config(config(i), name=f"standard-llama-h{sh['hidden']}-l{sh['layers']}")
