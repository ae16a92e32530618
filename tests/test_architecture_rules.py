"""Configs the architecture's own code cannot run are refused (exit 2 naming the key), and the ones it runs
are accepted with transformers' parameter count: each rule checked against transformers itself.

A tiny model (one layer, hidden 64-96, vocabulary 100) is built from the config with transformers'
``AutoConfig.for_model`` + ``AutoModelFor*.from_config`` and run on four tokens: a config "runs" when
both succeed. Some impossible head layouts construct and fail only in the attention's forward
(``repeat_kv`` giving K/V of another head count), hence the forward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuneplan.errors import ConfigError
from tuneplan.specs.model import model_from_config

TINY = dict(num_hidden_layers=1, intermediate_size=64, vocab_size=100, max_position_embeddings=64)


def transformers_run(model_type: str, head: str = "causal",
                     **kw: Any) -> tuple[dict[str, Any] | None, int | None]:
    """(the config transformers writes, its parameter count) when the model builds and runs; (None, None)
    when its config, constructor or forward raises."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    auto = transformers.AutoModelForMaskedLM if head == "masked" else transformers.AutoModelForCausalLM
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **kw)
        model = auto.from_config(cfg).eval()
        with torch.no_grad():
            model(input_ids=torch.tensor([[1, 2, 3, 4]]))
    except Exception:  # noqa: BLE001 - any refusal by transformers is the verdict under test
        return None, None
    return cfg.to_dict(), sum(p.numel() for p in model.parameters())


REFUSED = [  # (case, model_type, head, config keys, the key tuneplan must name)
    ("more K/V heads than heads", "llama", "causal",
     dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=8), "num_key_value_heads"),
    ("K/V heads do not divide the heads", "llama", "causal",
     dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=4), "num_key_value_heads"),
    ("K/V heads do not divide the heads", "mistral", "causal",
     dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=4), "num_key_value_heads"),
    ("more K/V heads than heads", "qwen2", "causal",
     dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=8), "num_key_value_heads"),
    ("hidden not split by heads", "llama", "causal",
     dict(hidden_size=68, num_attention_heads=8, num_key_value_heads=8, head_dim=8), "num_attention_heads"),
    ("hidden not split by heads", "gpt2", "causal", dict(n_embd=68, n_head=8, n_layer=1, vocab_size=100),
     "n_head"),
    ("hidden not split by heads", "bert", "masked", dict(hidden_size=68, num_attention_heads=8),
     "num_attention_heads"),
    ("hidden not split by heads", "gpt_neox", "causal", dict(hidden_size=68, num_attention_heads=8),
     "num_attention_heads"),
    ("one expert, top-k 2 (the default)", "mixtral", "causal",
     dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_local_experts=1),
     "num_experts_per_tok"),
    ("sparse step 0", "qwen2_moe", "causal",
     dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_experts=4, decoder_sparse_step=0),
     "decoder_sparse_step"),
]


@pytest.mark.parametrize(("case", "model_type", "head", "keys", "field"), REFUSED,
                         ids=[f"{r[1]}: {r[0]}" for r in REFUSED])
def test_what_transformers_cannot_run_is_refused(case: str, model_type: str, head: str, keys: dict[str, Any],
                                                 field: str) -> None:
    cfg = {**TINY, **keys}
    assert transformers_run(model_type, head, **cfg) == (None, None), f"{model_type} runs: {case}"
    with pytest.raises(ConfigError) as exc:
        model_from_config({"model_type": model_type, **cfg}, "m")
    assert exc.value.field == f"m.{field}"


ACCEPTED = [  # (case, model_type, config keys)
    ("grouped K/V heads", "llama", dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2)),
    ("hidden not split by heads, Mistral takes hidden // heads", "mistral",
     dict(hidden_size=68, num_attention_heads=8, num_key_value_heads=4)),
    ("hidden not split by heads, explicit head_dim", "qwen2",
     dict(hidden_size=68, num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
    ("sparse step past the layer count: every layer dense", "qwen2_moe",
     dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_experts=4, num_experts_per_tok=2,
          moe_intermediate_size=32, shared_expert_intermediate_size=64, decoder_sparse_step=100)),
    ("sliding window off, written as 0 by Qwen2MoeConfig", "qwen2_moe",
     dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_experts=4, num_experts_per_tok=2,
          moe_intermediate_size=32, shared_expert_intermediate_size=64, use_sliding_window=False)),
    ("one expert, top-1", "mixtral",
     dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_local_experts=1,
          num_experts_per_tok=1)),
]


@pytest.mark.parametrize(("case", "model_type", "keys"), ACCEPTED, ids=[f"{r[1]}: {r[0]}" for r in ACCEPTED])
def test_what_transformers_runs_is_accepted_with_its_count(case: str, model_type: str,
                                                           keys: dict[str, Any]) -> None:
    written, params = transformers_run(model_type, **{**TINY, **keys})
    assert written is not None, f"transformers refuses {model_type}: {case}"
    spec = model_from_config(json.loads(json.dumps(written, default=str)), "m")
    assert spec.params_total == params


def test_qwen2_moe_writes_sliding_window_0() -> None:
    """The case as transformers writes it: the window is 0 with use_sliding_window off."""
    written, _ = transformers_run("qwen2_moe", **{**TINY, **ACCEPTED[4][2]})
    assert written is not None and written["sliding_window"] == 0
    assert model_from_config(written, "m").sliding_window is None


def test_cli_refusal_is_exit_2_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", **TINY, "hidden_size": 96, "num_attention_heads": 6,
                               "num_key_value_heads": 4}))
    r = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "estimate", str(cfg), "--gpu", "rtx4090"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2, r.stderr
    assert "num_key_value_heads" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(("value", "offline"), [("no", False), ("0", False), ("off", False), ("false", False),
                                               ("1", True), ("yes", True), ("ON", True), ("true", True)])
def test_hub_offline_reads_the_variable_as_huggingface_hub_does(value: str, offline: bool) -> None:
    """huggingface_hub.constants: offline for 1 / on / yes / true (any case), online otherwise."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    code = "from tuneplan.catalog.models import hub_offline; print(hub_offline())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**env, "HF_HUB_OFFLINE": value})
    assert r.stdout.strip() == str(offline), r.stderr
