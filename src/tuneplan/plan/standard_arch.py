"""A standard decoder family scaled by size, for "the largest model that fits" beyond the catalog.

Shape rules (Llama 3 style, checked against the published configs of Llama-3-8B and Llama-3-70B):
- head_dim 128, hidden = 128 x s (s attention heads); Llama 3 8B: 4096 = 128 x 32, 70B: 8192 = 128 x 64;
- grouped-query attention with 8 key/value heads (fewer when there are fewer heads), as every Llama 3;
- SwiGLU MLP, intermediate = 3.5 x hidden rounded up to a multiple of 256 (14336 = 3.5 x 4096,
  28672 = 3.5 x 8192);
- layers = s, i.e. hidden / layers = 128 (Llama 3 8B: 4096 / 32 = 128; Llama 2 13B: 5120 / 40 = 128);
- vocabulary 128256 (the Llama 3 tokenizer), untied lm_head, RMSNorm, 131072 positions.
With s = 32 this is exactly Llama-3-8B (8,030,261,248 parameters).

The family is a staircase indexed by an integer ``i``: ``s = i // 2 + 1`` heads/layers, plus one more
layer on odd ``i``. Hidden size, layers, KV heads and intermediate size never decrease along it, so
every memory term (weights, gradients, states, activations, logits) is non-decreasing in ``i`` and
"fits" is monotone: bisection over ``i`` is exact. Consecutive sizes differ by about 3-6% near 8B.
"""

from __future__ import annotations

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
    return {"hidden": hidden, "layers": s + (i % 2), "heads": s, "kv_heads": min(KV_HEADS, s),
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
