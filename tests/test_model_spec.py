"""Parameter counts: exact against published totals and against transformers' own instantiation."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from tuneplan.catalog.models import catalog_entries, resolve_model
from tuneplan.errors import ConfigError, TuneplanError, UnknownNameError
from tuneplan.specs.model import model_from_config

from .conftest import LLAMA2_7B, QWEN25_7B, TINY_LLAMA

# Published totals (model cards / safetensors metadata).
PUBLISHED = {
    "Qwen/Qwen2.5-7B-Instruct": 7_615_616_512,
    "meta-llama/Llama-2-7b-hf": 6_738_415_616,
    "meta-llama/Meta-Llama-3-8B": 8_030_261_248,
    "Qwen/Qwen2.5-0.5B": 494_032_768,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
}


@pytest.mark.parametrize("name,total", sorted(PUBLISHED.items()))
def test_published_totals(name: str, total: int) -> None:
    assert resolve_model(name).params_total == total


def test_hand_count_llama2_7b() -> None:
    h, L, f, V = 4096, 32, 11008, 32000
    per_layer = 4 * h * h + 3 * h * f + 2 * h  # q,k,v,o + gate,up,down + 2 RMSNorm
    expected = L * per_layer + 2 * V * h + h  # + embed + lm_head + final norm
    assert model_from_config(LLAMA2_7B).params_total == expected == 6_738_415_616


def test_hand_count_qwen2_gqa_bias() -> None:
    h, L, f, V, kv = 3584, 28, 18944, 152064, 4 * 128
    attn = h * h + h + 2 * (h * kv + kv) + h * h  # q (+bias), k, v (+bias), o (no bias)
    expected = L * (attn + 3 * h * f + 2 * h) + 2 * V * h + h
    assert model_from_config(QWEN25_7B).params_total == expected


def test_every_catalog_entry_matches_transformers() -> None:
    """params_transformers was recorded by instantiating each config with transformers
    (tools/build_catalog_check.py)."""
    entries = [e for e in catalog_entries() if e.params_transformers]
    assert len(entries) >= 40
    checked = 0
    for e in entries:
        try:
            spec = resolve_model(e.hf_id)
        except ConfigError as exc:  # encoder-decoder models are refused with a clear message
            assert "encoder-decoder" in str(exc)
            continue
        assert spec.params_total == e.params_transformers, e.hf_id
        checked += 1
    assert checked >= 40


def test_catalog_files_have_sources() -> None:
    raw = json.loads(resources.files("tuneplan.catalog").joinpath("models/index.json").read_text())
    for d in raw:
        assert d.get("config_source"), d["hf_id"]
    aliases = [a.lower() for d in raw for a in d.get("aliases", [])]
    assert len(aliases) == len(set(aliases)), "aliases must be unique"


def test_meta_device_agrees_for_small_configs() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfgs = [TINY_LLAMA,
            dict(model_type="qwen2", hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=256, vocab_size=500, tie_word_embeddings=True),
            dict(model_type="mixtral", hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=256, vocab_size=500, num_local_experts=4,
                 num_experts_per_tok=2),
            dict(model_type="gemma2", hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, intermediate_size=256, vocab_size=500),
            dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=300, n_positions=128),
            dict(model_type="qwen3_moe", hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, intermediate_size=256, moe_intermediate_size=64,
                 num_experts=8, num_experts_per_tok=2, vocab_size=500)]
    for cfg in cfgs:
        conf = transformers.AutoConfig.for_model(**cfg)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(conf)
        n = sum(p.numel() for p in model.parameters())
        assert model_from_config(cfg).params_total == n, cfg["model_type"]


def test_unknown_model_type_is_generic_with_warning() -> None:
    cfg = dict(TINY_LLAMA, model_type="brand_new_llm")
    with pytest.warns(UserWarning, match="not a known family"):
        spec = model_from_config(cfg)
    assert spec.params_total == model_from_config(TINY_LLAMA).params_total


@pytest.mark.parametrize("missing", ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"])
def test_partial_config_names_missing_field(missing: str) -> None:
    cfg = {k: v for k, v in TINY_LLAMA.items() if k != missing}
    with pytest.raises(ConfigError) as exc:
        model_from_config(cfg, "x")
    assert missing in str(exc.value)


def test_nonsense_config_value() -> None:
    with pytest.raises(ConfigError, match="hidden_size"):
        model_from_config(dict(TINY_LLAMA, hidden_size=-5))


def test_unknown_model_has_suggestions() -> None:
    with pytest.raises(UnknownNameError) as exc:
        resolve_model("qwen2.5-7x", allow_network=False)
    assert exc.value.suggestions and any("Qwen2.5" in s for s in exc.value.suggestions)


def test_alias_and_case_insensitive_id() -> None:
    assert resolve_model("QWEN/qwen2.5-7b-instruct").params_total == 7_615_616_512
    assert resolve_model("qwen2.5-7b-instruct").name == "Qwen/Qwen2.5-7B-Instruct"


def test_local_config_path(tmp_path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(TINY_LLAMA))
    assert resolve_model(str(p)).params_total == model_from_config(TINY_LLAMA).params_total
    assert resolve_model(str(tmp_path)).params_total == model_from_config(TINY_LLAMA).params_total
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(TuneplanError, match="not valid JSON"):
        resolve_model(str(bad))
