"""Gemma-2 caps its logits (transformers Gemma2ForCausalLM.forward: ``logits / cap``, ``torch.tanh``,
``* cap`` with ``final_logit_softcapping`` 30): ``tanh`` saves its output for backward, one more 16-bit
tokens x vocabulary tensor from the end of the forward until the loss backward has run."""

from __future__ import annotations

from tuneplan.api import build_setup, estimate_run
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.run import resolve_run


def _logits_loss(model: str, **kw) -> int:
    spec = resolve_model(model)
    return estimate_run(resolve_run(spec, build_setup(spec, **kw))).breakdown.components["logits_loss"]


def test_gemma2_keeps_its_capped_logits_tanh_output_through_the_loss_backward() -> None:
    # LoRA, fp16, flash attention, 1 x 1024 tokens, vocabulary 256000, peak at the loss backward: by hand,
    # the default chain's 12 bytes per token x vocabulary entry (logits.py) plus tanh's saved fp16 output
    kw = dict(method="lora", precision="fp16", batch=1, seq=1024, attn="flash", gradient_checkpointing=True)
    tv = 1024 * 256000
    assert _logits_loss("google/gemma-2-2b", **kw) == 12 * tv + 2 * tv


def test_a_model_without_a_cap_keeps_no_tanh_output() -> None:
    # Gemma-3's config sets final_logit_softcapping to null: the default chain alone (vocabulary 262144)
    kw = dict(method="lora", precision="fp16", batch=1, seq=1024, attn="flash", gradient_checkpointing=True)
    assert _logits_loss("google/gemma-3-1b-it", **kw) == 12 * 1024 * 262144
