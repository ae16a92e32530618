"""deploy formats and KV cache, against hand derivations from each format's documented layout.

Every expected number below is worked out by hand from the shapes the formats document (GPTQ/AWQ tensor
shapes, bitsandbytes blocks, ggml block structs) or from the model's config, not from tuneplan's output.
"""

from __future__ import annotations

import pytest

from tuneplan.deploy.formats import awq_bytes, bnb_bytes, gguf_bytes, gptq_bytes, resolve_format
from tuneplan.deploy.gguf import gguf_tensors, tensor_type, use_more_bits
from tuneplan.deploy.kv_cache import kv_layout, sliding_layers
from tuneplan.deploy.weights import serving_weights
from tuneplan.errors import TuneplanError
from tuneplan.specs.model import model_from_config

# Llama-3.1-8B's shape (config.json): GQA with 8 KV heads of 128 over 32 query heads.
LLAMA8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
           "max_position_embeddings": 131072, "tie_word_embeddings": False}
# DeepSeek-V2-Lite's shape: MLA (kv_lora_rank 512, rope 64, nope 128, v 128), 27 layers, 16 heads.
DSV2_LITE = {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
             "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
             "vocab_size": 102400, "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128,
             "qk_rope_head_dim": 64, "v_head_dim": 128,
             "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
             "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
             "tie_word_embeddings": False}
# A small MLA + MoE model whose every tensor is summed by hand below.
MINI_MLA = {"model_type": "deepseek_v2", "hidden_size": 1024, "intermediate_size": 2048,
            "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1024, "kv_lora_rank": 256,
            "q_lora_rank": None, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
            "moe_intermediate_size": 512,
            "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
            "first_k_dense_replace": 1, "moe_layer_freq": 1, "tie_word_embeddings": False}


# ---- one weight matrix, k_proj of Llama-3.1-8B: d_in 4096, d_out 1024 ------------------------------------
def test_gptq_layout_of_one_matrix() -> None:
    # qweight int32 [4096*4/32, 1024] = 512 x 1024 x 4 B; qzeros int32 [32 groups, 1024*4/32 = 128] x 4 B;
    # scales fp16 [32, 1024] x 2 B; g_idx int32 [4096] x 4 B.
    expected = 512 * 1024 * 4 + 32 * 128 * 4 + 32 * 1024 * 2 + 4096 * 4
    assert expected == 2_195_456
    assert gptq_bytes(4096, 1024, bits=4) == expected
    # 8-bit: qweight [4096*8/32 = 1024, 1024] int32; qzeros [32, 256] int32; scales and g_idx as above.
    assert gptq_bytes(4096, 1024, bits=8) == 1024 * 1024 * 4 + 32 * 256 * 4 + 32 * 1024 * 2 + 4096 * 4


def test_awq_layout_of_one_matrix() -> None:
    # qweight int32 [4096, 1024/8]; qzeros int32 [32, 128]; scales fp16 [32, 1024]; no g_idx.
    assert awq_bytes(4096, 1024) == 4096 * 128 * 4 + 32 * 128 * 4 + 32 * 1024 * 2 == 2_179_072


def test_bnb_layouts_of_one_matrix() -> None:
    numel = 4096 * 1024
    blocks = numel // 64  # one absmax per 64 weights
    # NF4 + double quant: 0.5 B/weight, uint8 absmax per block, fp32 absmax per 256 blocks,
    # a 256-entry fp32 code table and one fp32 offset per tensor, and the 16-entry fp32 NF4 code book
    # every 4-bit QuantState keeps (bitsandbytes functional.get_4bit_type).
    nf4_code = 16 * 4
    assert bnb_bytes(4096, 1024, 4, double_quant=True) == (numel // 2 + blocks + 4 * (blocks // 256)
                                                           + 1024 + 4 + nf4_code)
    assert bnb_bytes(4096, 1024, 4, double_quant=False) == numel // 2 + 4 * blocks + nf4_code  # ~4.5 bits
    # LLM.int8: int8 weight plus one fp32 scale (SCB) per output row.
    assert bnb_bytes(4096, 1024, 8) == numel + 4 * 1024


@pytest.mark.parametrize("gtype, per_row", [
    ("Q4_K", 16 * 144),  # 4096 / 256 super-blocks of 2+2+12+128 B
    ("Q6_K", 16 * 210),  # 128 + 64 + 16 + 2 B per 256
    ("Q5_K", 16 * 176),  # 2+2+12+32+128
    ("Q8_0", 128 * 34),  # 4096 / 32 blocks of fp16 d + 32 int8
    ("Q4_0", 128 * 18),  # fp16 d + 16 B of nibbles
    ("Q5_0", 128 * 22),  # fp16 d + 4 B high bits + 16 B
    ("F16", 4096 * 2),
])
def test_gguf_block_layouts(gtype: str, per_row: int) -> None:
    assert gguf_bytes(gtype, 4096, 1024) == 1024 * per_row


def test_gguf_rejects_a_row_that_is_not_whole_blocks() -> None:
    with pytest.raises(ValueError):
        gguf_bytes("Q4_K", 896, 10)


# ---- GGUF type choice ---------------------------------------------------------------------------------
def test_use_more_bits_picks_16_of_32_layers() -> None:
    # first eighth (0-3), last eighth (28-31), and i with (i - 4) % 3 == 2 between: 6, 9, ..., 27
    chosen = [i for i in range(32) if use_more_bits(i, 32)]
    assert chosen == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def test_q4_k_m_size_of_llama_3_1_8b_by_hand() -> None:
    m = model_from_config(LLAMA8B)
    h, f, kv, v = 4096, 14336, 1024, 128256
    q4k = 144 / 256  # bytes per element
    q6k = 210 / 256
    per_layer_q4 = (h * h + h * kv + h * h + h * f * 2) * q4k  # q, k, o, gate, up always Q4_K
    attn_v = h * kv
    down = f * h
    more = 16  # layers where attn_v and ffn_down get Q6_K
    blocks = (32 * per_layer_q4 + more * (attn_v + down) * q6k + (32 - more) * (attn_v + down) * q4k)
    embed = v * h * q4k  # token_embd keeps the file type (Q4_K)
    output = v * h * q6k  # output.weight: Q6_K
    norms_f32 = 4 * (32 * 2 * h + h)
    expected = blocks + embed + output + norms_f32
    w = serving_weights(m, resolve_format("int4", "gguf-q4_k_m"))
    assert w.total == pytest.approx(expected, abs=1)
    assert w.gguf_types == {"Q4_K": 1 + 32 * 7 - 32, "Q6_K": 32 + 1}
    # The public Q4_K_M file of Llama-3.1-8B is 4.92 GB (bartowski) = 4.57 GiB (runyard.dev blog):
    # the tensors are all of it but the tokenizer and header, a few MB.
    assert 4.90e9 < w.total < 4.92e9


def test_gguf_fallbacks_for_rows_that_are_not_whole_super_blocks() -> None:
    # Qwen2.5-0.5B: hidden 896 = 3.5 x 256, tied embeddings.
    m = model_from_config({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                           "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                           "vocab_size": 151936, "tie_word_embeddings": True})
    assert tensor_type("attn_q", 5, 896, "Q4_K_M", m, 0, 24, False) == "Q5_0"  # Q4_K -> Q5_0
    assert tensor_type("attn_v", 0, 896, "Q4_K_M", m, 0, 24, False) == "Q8_0"  # Q6_K -> Q8_0
    assert tensor_type("ffn_down", 0, 4864, "Q4_K_M", m, 0, 24, False) == "Q6_K"  # 4864 = 19 x 256
    assert tensor_type("ffn_down", 4, 4864, "Q4_K_M", m, 0, 24, False) == "Q4_K"
    # tied: token_embd takes the output rule; its row (896) is not a multiple of Q4_K's 256 -> Q8_0
    tensors, _ = gguf_tensors(m, "Q4_K_M")
    assert [t.gtype for t in tensors if t.name == "token_embd"] == ["Q8_0"]
    assert not any(t.name == "output" for t in tensors)


def test_mixtral_rules_for_eight_experts() -> None:
    m = model_from_config({"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                           "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2})
    tensors, f32 = gguf_tensors(m, "Q4_K_M")
    types = {(t.name, t.layer): t.gtype for t in tensors}
    assert types[("attn_v", 10)] == "Q8_0" and types[("attn_k", 10)] == "Q8_0"
    assert types[("attn_output", 10)] == "Q5_K"
    assert types[("ffn_down_exps", 0)] == "Q6_K" and types[("ffn_down_exps", 4)] == "Q4_K"
    assert all(t.name != "ffn_gate_inp" for t in tensors)  # the router stays F32
    router = 32 * 4096 * 8 * 4
    norms = 4 * (32 * 2 * 4096 + 4096)
    assert f32 == router + norms


# ---- quantized weights of a whole model ----------------------------------------------------------------
def _gptq4(d_in: int, d_out: int) -> int:
    g = d_in // 128
    return d_in // 8 * d_out * 4 + g * d_out // 8 * 4 + g * d_out * 2 + d_in * 4


def test_gptq_weights_of_llama_8b_by_hand() -> None:
    m = model_from_config(LLAMA8B)
    h, f, kv, v = 4096, 14336, 1024, 128256
    layer = 2 * _gptq4(h, h) + 2 * _gptq4(h, kv) + 2 * _gptq4(h, f) + _gptq4(f, h)
    unquantized = 2 * (2 * v * h + 32 * 2 * h + h)  # embeddings, lm_head, norms in fp16
    w = serving_weights(m, resolve_format("int4", "gptq"))
    assert w.quantized == 32 * layer
    assert w.unquantized == unquantized
    # 16-bit: 2 B per parameter, nothing else
    assert serving_weights(m, resolve_format("bf16", None)).total == 2 * m.params_total


def test_gptq_and_bnb_weights_of_an_mla_moe_model_by_hand() -> None:
    m = model_from_config(MINI_MLA)
    h = 1024
    # attention (no q_lora): q 1024->8*96, kv_a 1024->256+32, kv_b 256->8*(64+64), o 8*64->1024
    attn = [(h, 768), (h, 288), (256, 1024), (512, h)]
    dense_mlp = [(h, 2048), (h, 2048), (2048, h)]
    expert = [(h, 512), (h, 512), (512, h)]  # x 4 routed experts, and once more as the shared expert
    quantized = sum(_gptq4(a, b) for a, b in attn) * 2 + sum(_gptq4(a, b) for a, b in dense_mlp)
    quantized += sum(_gptq4(a, b) for a, b in expert) * (4 + 1)
    router = 2 * h * 4  # layer 1's gate 1024 -> 4 experts, kept fp16
    norms = 2 * (2 * (2 * h + 256) + h)  # per layer: 2 RMSNorms + the kv_a_layernorm; final norm
    embeds = 2 * 2 * 1024 * h
    w = serving_weights(m, resolve_format("int4", "gptq"))
    assert w.quantized == quantized
    assert w.unquantized == router + norms + embeds
    # bitsandbytes quantizes the router too (every Linear in the blocks), NF4 + double quant
    wb = serving_weights(m, resolve_format("int4", "bnb"))
    nf4_total = (sum(_nf4(a, b) for a, b in attn) * 2 + sum(_nf4(a, b) for a, b in dense_mlp)
                 + sum(_nf4(a, b) for a, b in expert) * 5 + _nf4(h, 4))
    assert wb.quantized == nf4_total


def _nf4(d_in: int, d_out: int) -> int:
    n = d_in * d_out
    blocks = -(-n // 64)
    return n // 2 + blocks + 4 * -(-blocks // 256) + 1024 + 4 + 16 * 4  # see test_bnb_layouts_of_one_matrix


def test_tensor_parallel_splits_all_but_the_norms() -> None:
    m = model_from_config(LLAMA8B)
    w = serving_weights(m, resolve_format("bf16", None))
    norms = 2 * (32 * 2 * 4096 + 4096)
    assert w.per_gpu(1) == w.total
    assert w.per_gpu(4) == (w.total - norms) // 4 + norms


# ---- KV cache --------------------------------------------------------------------------------------------
def test_kv_cache_of_a_gqa_model_by_hand() -> None:
    m = model_from_config(LLAMA8B)
    # K and V, 8 heads x 128, 32 layers, 2 B: 131072 B = 128 KiB per token
    per_token = 2 * 8 * 128 * 32 * 2
    kv = kv_layout(m, dtype_bytes=2)
    assert kv.kind == "gqa"
    assert kv.bytes_for(8192, 4) == per_token * 8192 * 4 == 4 * 1024**3
    assert kv_layout(m, dtype_bytes=1).bytes_for(1) == per_token // 2  # fp8
    assert kv_layout(m, dtype_bytes=2, tp=2).bytes_for(1) == per_token // 2  # 4 heads per GPU
    assert kv_layout(m, dtype_bytes=2, tp=16).bytes_for(1) == per_token // 8  # one (replicated) head each


def test_kv_cache_of_an_mla_model_by_hand() -> None:
    m = model_from_config(DSV2_LITE)
    latent = 27 * (512 + 64) * 2  # compressed KV + shared rope key, once per layer
    expanded = 27 * 16 * ((128 + 64) + 128) * 2  # K: heads x (nope + rope), V: heads x v_head
    assert kv_layout(m).bytes_for(1) == latent == 31_104
    assert kv_layout(m, mla="expanded").bytes_for(1) == expanded == 276_480
    assert kv_layout(m, tp=2).bytes_for(1000) == 1000 * latent  # the latent is not split by heads
    assert kv_layout(m, mla="expanded", tp=2).bytes_for(1) == expanded // 2
    assert kv_layout(m).kind == "mla-latent"


def test_sliding_window_layers_of_gemma_2() -> None:
    m = model_from_config({"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
                           "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
                           "head_dim": 256, "vocab_size": 256000, "sliding_window": 4096})
    assert sliding_layers(m) == (21, 4096)  # layers 0, 2, 4, ... slide
    per_layer = 2 * 8 * 256 * 2
    kv = kv_layout(m)
    assert kv.bytes_for(2048) == 42 * per_layer * 2048  # below the window every layer holds all tokens
    assert kv.bytes_for(8192) == 21 * per_layer * 8192 + 21 * per_layer * 4096


def test_qwen2_sliding_window_is_off_unless_enabled() -> None:
    cfg = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
           "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
           "sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 21}
    assert sliding_layers(model_from_config(cfg)) == (0, None)
    assert sliding_layers(model_from_config({**cfg, "use_sliding_window": True})) == (3, 32768)


def test_bad_format_and_kv_inputs_name_the_field() -> None:
    with pytest.raises(TuneplanError) as e:
        resolve_format("int4", "gguf-q8_0")
    assert e.value.field == "quant_method"
    with pytest.raises(TuneplanError) as e:
        resolve_format("int3", None)
    assert e.value.field == "serve_precision"
    with pytest.raises(TuneplanError) as e:
        kv_layout(model_from_config(DSV2_LITE), mla="compressed")
    assert e.value.field == "mla_cache"
