"""The dropout probabilities a transformers config sets, as its modeling code applies them in training
(what the activation walk counts a mask for: estimator/layer_walk.py, estimator/activations.py)."""

from __future__ import annotations

from typing import Any


def model_dropout(cfg: dict[str, Any]) -> tuple[float, float, float]:
    """(attention-probs, residual/hidden, embedding) dropout of a config, as transformers applies them in
    training: Llama-style configs ship 0.0; GPT-2 attn_pdrop/resid_pdrop/embd_pdrop 0.1; BERT
    attention_probs_dropout_prob / hidden_dropout_prob 0.1."""
    attn = _first_number(cfg, ("attn_pdrop", "attention_probs_dropout_prob", "attention_dropout"))
    hidden = _first_number(cfg, ("resid_pdrop", "hidden_dropout_prob", "hidden_dropout"))
    embd = _first_number(cfg, ("embd_pdrop", "hidden_dropout_prob", "embed_dropout"))
    return attn, hidden, embd


def _first_number(cfg: dict[str, Any], keys: tuple[str, ...]) -> float:
    """The first of ``keys`` whose value in ``cfg`` is a number (not a bool), else 0."""
    for k in keys:
        v = cfg.get(k)
        if v is not None and type(v) is not bool and isinstance(v, (int, float)):
            return float(v)
    return 0.0
