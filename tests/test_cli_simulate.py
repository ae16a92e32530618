"""`tuneplan simulate` builds its result as `estimate` does: same model as built, same parameter counts."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tuneplan.cli.app import app

pytestmark = pytest.mark.slow  # runs a simulated training step (pyproject.toml markers)

pytest.importorskip("transformers")
pytest.importorskip("peft")

# 2 layers, hidden 128, 4 heads of 32, 2 KV heads, SwiGLU 256, vocab 2000, untied.
TINY = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 2000,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "architectures": ["LlamaForCausalLM"],
}
# By hand, as LlamaForSequenceClassification with 2 labels (lm_head replaced by score, 2 x 128, no bias):
# embedding 2000*128 = 256000; per layer q 128*128 + k 128*64 + v 128*64 + o 128*128 = 49152, MLP
# 3*128*256 = 98304, two norms 256 -> 147712, x2 = 295424; final norm 128; score 256.
TOTAL = 256000 + 295424 + 128 + 256
# LoRA r=16 on q_proj (128->128) and v_proj (128->64): 16*(128+128) + 16*(128+64) = 7168 per layer, x2,
# plus PEFT's trained copy of the score head (modules_to_save) 256.
TRAINABLE = 2 * 7168 + 256


def test_simulate_counts_what_estimate_counts(tmp_path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    runner = CliRunner()
    out = {}
    for name, args in (
        ("estimate", ["estimate", str(cfg), "--engine", "simulate", "--num-labels", "2", "--json"]),
        ("simulate", ["simulate", str(cfg), "--num-labels", "2", "--json"]),
    ):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output[-2000:]
        out[name] = json.loads(r.stdout)
    for d in out.values():
        assert d["model"]["params_total"] == TOTAL == 551808
        assert d["model"]["params_trainable"] == TRAINABLE == 14592
    assert out["simulate"]["per_gpu"] == out["estimate"]["per_gpu"]
    assert "simulation" in out["simulate"]
