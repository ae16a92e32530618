"""The tiny untied Llama the sharded-simulation tests derive their bytes from by hand (one config, three
wrappers: FSDP1, FSDP2, DeepSpeed ZeRO)."""

from __future__ import annotations

H, L, A, KV, F, V = 64, 2, 4, 2, 128, 256
D = H // A
TINY = dict(model_type="llama", hidden_size=H, num_hidden_layers=L, num_attention_heads=A,
            num_key_value_heads=KV, intermediate_size=F, vocab_size=V, tie_word_embeddings=False)
ROPE = 2 * 512  # inv_freq and original_inv_freq, head_dim / 2 fp32 each: one 512-byte block apiece


def r512(n: int) -> int:
    """The allocator's rounding: every block a multiple of 512 bytes."""
    return -(-n // 512) * 512
