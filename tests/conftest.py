"""Shared fixtures: small hand-written configs (independent of the catalog), and a CLI runner."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

QWEN25_7B = dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False)
LLAMA2_7B = dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False)
TINY_LLAMA = dict(model_type="llama", hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, intermediate_size=688, vocab_size=1000, tie_word_embeddings=False)


@pytest.fixture
def qwen7b():
    from tuneplan.specs.model import model_from_config

    return model_from_config(QWEN25_7B, "Qwen2.5-7B (hand config)")


@pytest.fixture
def tiny_llama():
    from tuneplan.specs.model import model_from_config

    return model_from_config(TINY_LLAMA, "tiny-llama")


BERT_CLASSIFIER_ARGS = ("google-bert/bert-large-uncased", "--method", "full", "--precision", "fp32",
                        "--batch", "4", "--seq", "512", "--attn", "eager", "--num-labels", "2")


def cli_allocated_peak(*args: str) -> int:
    """`tuneplan estimate ARGS --json` in a fresh offline process: the allocated peak it reports."""
    out = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "estimate", *args, "--json"],
                         capture_output=True, text=True, timeout=120,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode in (0, 1), out.stderr  # 1: does not fit the default GPU, still a full report
    return json.loads(out.stdout)["per_gpu"]["allocated_peak_bytes"]
