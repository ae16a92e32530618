"""The sane ranges of every number tuneplan reads, and the limits on what it reads, in one place.

A value outside its range is refused at the boundary (the specs and the file readers), with the field and
the range in the message, before any formula runs: no formula ever sees a negative width, a NaN price or
a billion layers. Each bound is the largest value of a public model or machine times a margin, so that a
real model of the next few years still passes while nonsense (and work that would take minutes) does not.
"""

from __future__ import annotations

import math
from typing import Any

from tuneplan.errors import TuneplanError

# ---- what is read -------------------------------------------------------------------------------
# A config.json of the largest public model is ~10 KiB; a training config (YAML/JSON/TOML) or a doctor
# machine file a few KiB. 4 MiB is ~400x that and still parses in well under a second.
MAX_FILE_BYTES = 4 * 1024 * 1024
# Real configs nest 3-4 levels (DeepSpeed's zero_optimization.offload_optimizer.device); 32 is 8x that
# and far below Python's recursion limit, which a deeper document would hit in the parsers or later walks.
MAX_NESTING = 32
# YAML anchors are used a handful of times in real configs (axolotl's shared dataset blocks); what the
# document expands to, counting every alias as the copy it stands for, is capped at 100,000 nodes
# (~100x a large real config), which refuses a "billion laughs" bomb before it is walked.
MAX_YAML_NODES = 100_000
# Linux refuses a path component over 255 bytes (NAME_MAX) and a path over 4096 (PATH_MAX); a Hub id is
# at most 96 characters for each of owner and name. A name longer than PATH_MAX is refused as such.
MAX_NAME_CHARS = 4096
MAX_NAME_COMPONENT = 255

# ---- model config.json ----------------------------------------------------------------------------
# name -> (low, high, why). Values are integers; ``low`` is the smallest valid value.
MODEL_INT_RANGES: dict[str, tuple[int, int, str]] = {
    # Llama 3.1 405B: 126 layers; the largest public decoders stay below 200. 2,048 is 10x+, and keeps a
    # per-layer loop (MoE layer selection) instant.
    "num_hidden_layers": (1, 2_048, "Llama 3.1 405B has 126 layers"),
    # Llama 3.1 405B: 16,384; Grok-1 6,144; 131,072 is 8x the widest.
    "hidden_size": (1, 131_072, "Llama 3.1 405B has hidden 16384"),
    # Nemotron-4 340B: 73,728 (the widest public MLP); 1,048,576 is 14x.
    "intermediate_size": (1, 1_048_576, "Nemotron-4 340B has 73728"),
    # Llama 3.1 405B: 128 query heads; 4,096 is 32x.
    "num_attention_heads": (1, 4_096, "Llama 3.1 405B has 128 heads"),
    "num_key_value_heads": (1, 4_096, "at most the number of query heads"),
    # Gemma: 256; DeepSeek MLA q/k: 192. 8,192 is 32x.
    "head_dim": (1, 8_192, "Gemma has head_dim 256"),
    # Gemma 3: 262,144 tokens (the largest public vocabulary); 4,194,304 is 16x.
    "vocab_size": (1, 4_194_304, "Gemma 3 has 262144 tokens"),
    # Qwen3-Next: 512 routed experts, Kimi K2: 384; 16,384 is 32x.
    "num_experts": (0, 16_384, "Qwen3-Next has 512 experts"),
    # DeepSeek-V3 and Kimi K2: 8 experts per token, Qwen3-Next 10; bounded by the expert count as well.
    "num_experts_per_tok": (1, 16_384, "DeepSeek-V3 routes each token to 8 experts"),
    "moe_intermediate_size": (1, 1_048_576, "as intermediate_size"),
    "shared_expert_intermediate_size": (0, 1_048_576, "as intermediate_size"),
    "n_shared_experts": (0, 16_384, "DeepSeek-V3 has 1 shared expert"),
    # every k-th layer is MoE (DeepSeek moe_layer_freq, Qwen decoder_sparse_step): 1..layers
    "moe_layer_freq": (1, 2_048, "1 = every layer; at most the layer bound"),
    "decoder_sparse_step": (1, 2_048, "1 = every layer; at most the layer bound"),
    "first_k_dense_replace": (0, 2_048, "DeepSeek-V3: the first 3 layers are dense"),
    # DeepSeek-V3 MLA ranks: kv 512, q 1,536, rope 64, nope 128, v 128
    "kv_lora_rank": (1, 131_072, "DeepSeek-V3 has 512; at most the hidden bound"),
    "q_lora_rank": (1, 131_072, "DeepSeek-V3 has 1536; at most the hidden bound"),
    "qk_nope_head_dim": (1, 8_192, "DeepSeek-V3 has 128"),
    "qk_rope_head_dim": (0, 8_192, "DeepSeek-V3 has 64"),
    "v_head_dim": (1, 8_192, "DeepSeek-V3 has 128"),
    # Llama 4 Scout: 10,485,760 positions; 2^28 is 25x.
    "max_position_embeddings": (1, 268_435_456, "Llama 4 Scout has 10485760"),
    "sliding_window": (1, 268_435_456, "at most the position bound"),
    "type_vocab_size": (0, 4_194_304, "BERT has 2"),
}
# config.json spellings of the same quantity -> the name whose range applies
MODEL_INT_ALIASES = {
    "n_embd": "hidden_size", "d_model": "hidden_size",
    "n_layer": "num_hidden_layers", "num_layers": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads", "multi_query_group_num": "num_key_value_heads",
    "kv_channels": "head_dim",
    "padded_vocab_size": "vocab_size",
    "ffn_hidden_size": "intermediate_size", "n_inner": "intermediate_size", "d_ff": "intermediate_size",
    "num_local_experts": "num_experts", "n_routed_experts": "num_experts",
    "n_positions": "max_position_embeddings", "seq_length": "max_position_embeddings",
}
# The total the built spec may have: Kimi K2 has ~1.04 T parameters; 10^15 is ~1000x, above the largest
# shape `max-model` bisects over (plan/standard_arch: 2.2e14 at hidden 131072, 1025 layers). A config
# inside every per-field range but multiplying out beyond this is refused too.
MAX_MODEL_PARAMS = 10**15

# ---- training setup ---------------------------------------------------------------------------------
SETUP_INT_RANGES: dict[str, tuple[int, int, str]] = {
    # a micro-batch of 65,536 sequences is ~100x the largest used on one device
    "batch": (1, 65_536, "sequences per GPU per step"),
    # the longest contexts trained (Llama 4 Scout 10 M positions) are below 4 Mi tokens per GPU
    "seq": (1, 4_194_304, "tokens per sequence"),
    "grad_accum": (1, 1_048_576, "micro-batches per optimizer step"),
    # 8 per node is usual, 16-72 on NVL/HGX racks; 1,024 is 14x the largest (GB200 NVL72)
    "gpus": (1, 1_024, "GPUs per node"),
    # the largest reported training clusters have ~100,000 GPUs (12,500 nodes of 8); 1,000,000 is 80x
    "nodes": (1, 1_000_000, "nodes"),
    "freeze_trainable_layers": (1, 2_048, "at most the layer bound"),
}

# `gpus --max-gpus`: the card counts searched (1..8, then whole nodes of 8). 1,024 cards is 128 nodes, beyond
# what a fine-tune plan asks about, and keeps the search to ~135 counts per card.
MAX_SEARCH_GPUS = 1_024

# `deploy`: serving numbers. Context as the position bound above; 1,048,576 sequences at once is ~1000x
# what one vLLM engine schedules (max_num_seqs defaults to 256); tensor parallelism within the card bound.
DEPLOY_INT_RANGES: dict[str, tuple[int, int, str]] = {
    "context": (1, 268_435_456, "tokens per sequence; Llama 4 Scout has 10485760 positions"),
    "concurrency": (1, 1_048_576, "sequences served at once"),
    "tp": (1, 1_024, "tensor-parallel GPUs"),
    "prefill_tokens": (1, 268_435_456, "tokens per engine step"),
}

# ---- hardware and prices ------------------------------------------------------------------------------
# A real number here is finite and at most this: no card has 10^6 GiB, 10^7 TFLOPS or costs 10^9 USD.
MAX_HARDWARE_NUMBER = 1e9
# USD figures (per GPU-hour, per card, per kWh) and years: finite, >= 0, and below a billion.
MAX_PRICE = 1e9
# the epochs of one fine-tune: real runs use 1-10; 10,000 is 1,000x and keeps the totals finite
MAX_EPOCHS = 10_000.0
# tokens or samples of one epoch: the largest pre-training corpora are ~3.6e13 tokens; 10^15 is ~30x
MAX_DATASET_TOKENS = 10**15


def check_int(field: str, value: Any, low: int, high: int, why: str = "") -> int:
    """An integer in [low, high] (a bool is not one), or a TuneplanError naming the field and the range."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value) and value == int(value):
            value = int(value)
        else:
            raise TuneplanError(f"must be an integer, got {show_value(value)}", field=field,
                                accepted=f"an integer in {low}..{high}")
    if not low <= value <= high:
        raise TuneplanError(f"{show_value(value)} is outside the sane range" + (f" ({why})" if why else ""),
                            field=field, accepted=f"an integer in {low}..{high}")
    assert isinstance(value, int)  # a non-int was converted above or refused
    return value


def check_number(field: str, value: Any, low: float, high: float, *, low_open: bool = False,
                 accepted: str | None = None) -> float:
    """A finite real number in [low, high] (or (low, high] with ``low_open``), else a TuneplanError."""
    rng = accepted or (f"a number {'>' if low_open else '>='} {low:g} and <= {high:g}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TuneplanError(f"must be a number, got {show_value(value)}", field=field, accepted=rng)
    # an int is compared as it is (exactly, however large): float(10**400) would raise OverflowError
    if isinstance(value, float) and not math.isfinite(value):
        raise TuneplanError(f"must be a finite number, got {show_value(value)}", field=field, accepted=rng)
    if value < low or (low_open and value == low) or value > high:
        raise TuneplanError(f"{show_value(value)} is out of range", field=field, accepted=rng)
    return float(value)


def show_value(value: Any) -> str:
    """A value as a message shows it: repr, cut to 60 characters (a hostile value may be huge)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
