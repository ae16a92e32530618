"""specs/families.py: per-family layer layouts, checked against published parameter totals, and the head
count rules the architectures' own code enforces."""

from __future__ import annotations

import pytest

from tests.conftest import LLAMA2_7B, QWEN25_7B
from tuneplan.errors import ConfigError
from tuneplan.specs.families import build_layers, check_heads, family_of
from tuneplan.specs.model import LayerSpec, Linear, ModelSpec


def build(cfg: dict, model_type: str, hidden: int, n_layers: int, n_heads: int, vocab: int) -> ModelSpec:
    family, _ = family_of(model_type)
    return build_layers(cfg, name="m", family=family, model_type=model_type, hidden=hidden, n_layers=n_layers,
                        n_heads=n_heads, vocab=vocab, spec_cls=ModelSpec, layer_cls=LayerSpec,
                        linear_cls=Linear)


def test_family_of():
    assert family_of("mistral") == ("llama", True)
    assert family_of("mixtral") == ("moe", True)
    assert family_of("gpt2") == ("gpt", True)
    assert family_of("deepseek_v3") == ("deepseek", True)
    assert family_of("something_new") == ("llama", False)  # unknown: the Llama layout, flagged as a guess


def test_llama2_7b_matches_its_published_total():
    # meta-llama/Llama-2-7b-hf: 6,738,415,616 parameters (model.num_parameters())
    spec = build(LLAMA2_7B, "llama", 4096, 32, 32, 32000)
    assert spec.params_total == 6_738_415_616
    assert (spec.mlp_kind, spec.norm_kind, spec.tied_embeddings) == ("swiglu", "rms", False)


def test_mistral_7b_matches_its_published_total():
    # mistralai/Mistral-7B-v0.1: 7,241,732,096 parameters; 8 K/V heads of 128
    cfg = dict(model_type="mistral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, vocab_size=32000, sliding_window=4096)
    spec = build(cfg, "mistral", 4096, 32, 32, 32000)
    assert spec.params_total == 7_241_732_096
    assert spec.n_kv_heads == 8 and spec.sliding_window == 4096


def test_qwen25_7b_matches_its_published_total():
    # Qwen/Qwen2.5-7B: 7,615,616,512 parameters (q/k/v projections carry biases)
    spec = build(QWEN25_7B, "qwen2", 3584, 28, 28, 152064)
    assert spec.params_total == 7_615_616_512


def test_gpt2_matches_its_published_total():
    # openai-community/gpt2: 124,439,808 parameters: tied lm_head, learned positions 1,024 x 768,
    # Conv1D c_attn h -> 3h, c_proj, c_fc h -> 4h (n_inner unset), LayerNorms with biases
    cfg = dict(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024)
    spec = build(cfg, "gpt2", 768, 12, 12, 50257)
    assert spec.params_total == 124_439_808
    assert (spec.mlp_kind, spec.norm_kind, spec.tied_embeddings) == ("gelu", "layer", True)
    assert spec.max_position == 1024


@pytest.mark.parametrize("window, expected", [(4096, 4096), (0, None), (False, None), (None, None)])
def test_a_sliding_window_of_zero_or_false_is_none(window, expected):
    cfg = {**LLAMA2_7B, "model_type": "mistral", "sliding_window": window}
    assert build(cfg, "mistral", 4096, 32, 32, 32000).sliding_window == expected


def test_mha_only_architectures_ignore_a_stray_kv_head_count():
    cfg = dict(model_type="gpt2", n_embd=768, n_layer=2, n_head=12, vocab_size=100, num_key_value_heads=4)
    assert build(cfg, "gpt2", 768, 2, 12, 100).n_kv_heads == 12


def test_kv_heads_must_divide_the_heads():
    with pytest.raises(ConfigError) as err:
        check_heads({"num_key_value_heads": 3}, "m", "llama", "llama", 4096, 32, 3)
    assert err.value.field == "m.num_key_value_heads"
    assert err.value.accepted == "a divisor of num_attention_heads (32): 1, 2, 4, 8, 16, 32"
    with pytest.raises(ConfigError):
        check_heads({"num_key_value_heads": 64}, "m", "llama", "llama", 4096, 32, 64)  # more than heads


def test_deepseek_latent_attention_has_no_kv_groups():
    check_heads({}, "m", "deepseek_v3", "deepseek", 7168, 128, 3)  # no error: K/V expand to every head


def test_hidden_must_split_into_heads_where_the_code_requires_it():
    with pytest.raises(ConfigError) as err:
        check_heads({"num_attention_heads": 3}, "m", "llama", "llama", 4000, 3, 3)
    assert err.value.field == "m.num_attention_heads"
    check_heads({"num_attention_heads": 3}, "m", "mistral", "llama", 4000, 3, 3)  # Mistral builds it


def test_deepseek_dense_layers_come_first_in_layer_order() -> None:
    # transformers DeepseekV2DecoderLayer: the dense MLP for layer_idx < first_k_dense_replace, the MoE
    # after it; freeze trains the top layers, both MoE here: 2 x (attention + router + 8 experts x 3 x
    # 64 x 32 + shared 3 x 64 x 32 + norms)
    from tuneplan.estimator.wrappers.zero3_coordinator import top_layers_params
    from tuneplan.specs.model import model_from_config

    cfg = dict(model_type="deepseek_v2", hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=4, intermediate_size=256, moe_intermediate_size=32, n_routed_experts=8,
               n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=16,
               q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, vocab_size=128)
    spec = model_from_config(cfg, "tiny-deepseek")
    (first, n_first), (second, n_second) = spec.layer_groups
    assert (n_first, n_second) == (1, 2) and not first.moe and second.moe
    attn = 64 * 4 * 24 + 64 * (16 + 8) + 16 * 4 * (16 + 16) + 4 * 16 * 64
    moe = attn + 64 * 8 + 8 * 3 * 64 * 32 + 3 * 64 * 32
    norms = 2 * 64 + 16
    assert top_layers_params(spec, 2) == 2 * (moe + norms)
    # the dense layer's gate_proj / up_proj / down_proj are nn.Linear modules PEFT's "all-linear" adapts;
    # the experts' of the same names are fused 3-D parameters it leaves alone
    from tuneplan.specs.lora_targets import resolve_targets

    assert {"gate_proj", "up_proj", "down_proj"} <= resolve_targets(spec, "all-linear")
