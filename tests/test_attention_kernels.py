"""The attention kernels transformers' classes lack (specs/attention_kernels.py): what the default setup runs
and which explicit kernels cannot run.

Expected values come from transformers' own code: ``get_correct_attn_implementation`` asks for SDPA when
``attn_implementation`` is unset and falls back to eager where the class cannot dispatch it, and raises on an
explicit kernel the class lacks (modeling_utils.py, 5.25); Gemma 2's class sets ``_supports_sdpa = False``
(soft-capping), BLOOM's sets neither flag.
"""

from __future__ import annotations

import importlib

import pytest

from tuneplan.api import build_setup
from tuneplan.catalog.models import catalog_entries, resolve_model
from tuneplan.compat import check
from tuneplan.specs.attention_kernels import MISSING, missing_kernel, transformers_default

GEMMA2 = "google/gemma-2-2b"
BLOOM = "bigscience/bloomz-7b1"
LLAMA = "meta-llama/Llama-2-7b-hf"


def _codes(model: str, **kw: object) -> set[str]:
    spec = resolve_model(model)
    return {f.code for f in check(None, build_setup(spec, None, method="lora", **kw), spec)}


def test_the_default_runs_eager_where_transformers_has_no_sdpa() -> None:
    """Left unset, the HF profile's attention is what transformers falls back to: eager for Gemma 2 and
    BLOOM, SDPA elsewhere; a framework with its own model code keeps its own default."""
    g = build_setup(resolve_model(GEMMA2), None, method="lora")
    assert g.attn == "eager" and "no SDPA path" in g.sources["attn"]
    assert build_setup(resolve_model(BLOOM), None, method="lora").attn == "eager"
    assert build_setup(resolve_model(LLAMA), None, method="lora").attn == "sdpa"
    assert build_setup(resolve_model(GEMMA2), None, method="lora", framework="unsloth").attn == "flash"


def test_an_explicit_kernel_the_class_lacks_cannot_run() -> None:
    assert "attn-kernel-missing" in _codes(GEMMA2, attn="sdpa")
    assert "attn-kernel-missing" not in _codes(GEMMA2, attn="flash")  # Gemma 2 has a FlashAttention path
    assert "attn-kernel-missing" not in _codes(GEMMA2, attn="eager")
    assert "attn-kernel-missing" in _codes(BLOOM, attn="flash")
    assert "attn-kernel-missing" not in _codes(LLAMA, attn="sdpa")
    # torchtune runs its own Gemma 2 code, not transformers' class
    assert "attn-kernel-missing" not in _codes(GEMMA2, attn="sdpa", framework="torchtune")


def test_the_default_estimate_counts_eager_scores_for_gemma2() -> None:
    """Eager attention saves per layer the fp32 softmax, its 16-bit cast and the capped scores' tanh
    output, ``(4 + 2 + 2) x heads x seq^2`` bytes a sequence, which FlashAttention does not: the default
    estimate at 4,096 tokens is above the explicit FlashAttention one by that, summed over Gemma 2 2B's 26
    layers and 8 heads (8 x 8 x 4096^2 x 26 B = 26 GiB), within 1 % (the kernels' O(seq) tensors: the
    attention output FlashAttention keeps is 2 x 2,304 x 4,096 B = 19 MB a layer against 1 GiB of
    scores)."""
    from tuneplan.api import estimate

    kw = {"method": "lora", "seq": 4096, "gradient_checkpointing": False}
    eager = estimate(GEMMA2, **kw).breakdown.allocated_peak_bytes
    flash = estimate(GEMMA2, attn="flash", **kw).breakdown.allocated_peak_bytes
    assert (eager - flash) / (8 * 8 * 4096**2 * 26) == pytest.approx(1.0, abs=0.01)


def test_the_table_matches_transformers_classes() -> None:
    """Every catalog model type with a transformers class: the table lists exactly the kernels whose
    ``_supports_*`` flag the installed transformers leaves False."""
    pytest.importorskip("transformers")
    mapping = importlib.import_module("transformers.models.auto.modeling_auto")
    seen = set()
    for entry in catalog_entries():
        try:
            mt = resolve_model(entry.hf_id).model_type
        except Exception:  # noqa: BLE001 - model types tuneplan refuses (encoder-decoder) are not planned
            continue
        cls_name = (mapping.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(mt) or mapping.MODEL_MAPPING_NAMES.get(mt))
        if mt in seen or cls_name is None:
            continue
        seen.add(mt)
        try:
            module = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
        except ImportError:
            continue  # a model type whose module is named otherwise (gemma3_text lives in gemma3)
        cls = getattr(module, cls_name)
        assert (missing_kernel(mt, "sdpa") is None) == bool(cls._supports_sdpa), mt
        assert (missing_kernel(mt, "flash") is None) == bool(cls._supports_flash_attn), mt
    assert set(MISSING) <= seen and transformers_default("gemma2") == "eager"
