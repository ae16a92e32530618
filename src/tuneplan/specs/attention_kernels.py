"""The attention kernels transformers' own model classes do not have, by model type.

transformers (``modeling_utils.PreTrainedModel.get_correct_attn_implementation``, checked in 5.25): with
``attn_implementation`` unset it asks for SDPA and, where the class cannot dispatch it
(``_supports_sdpa = False``), falls back to eager; asked for SDPA explicitly it raises, and asked for
FlashAttention on a class with ``_supports_flash_attn = False`` it raises too. So the same default setup
runs eager attention (O(seq^2) saved scores) on these models, and an explicit kernel they lack cannot run.
Only frameworks that run transformers' model code (``Profile.model_code == "hf"``) are concerned.
"""

from __future__ import annotations

# model_type -> {kernel: why the class has no such path}; the catalog's model types checked against the
# classes' flags in transformers 5.25 (every other one supports both).
MISSING: dict[str, dict[str, str]] = {
    # modeling_gemma2.py: "_supports_sdpa = False  # sdpa does not support softcapping"
    "gemma2": {"sdpa": "its attention scores are soft-capped (tanh), which SDPA cannot apply"},
    # modeling_bloom.py sets neither flag: BLOOM adds its ALiBi bias inside the score matmul (baddbmm)
    "bloom": {"sdpa": "its ALiBi bias is added inside the eager score matmul",
              "flash": "its ALiBi bias is added inside the eager score matmul"},
}


def missing_kernel(model_type: str, attn: str | None) -> str | None:
    """Why transformers' class for ``model_type`` has no ``attn`` kernel ("sdpa" / "flash"), or None."""
    return MISSING.get(model_type, {}).get(attn or "")


def transformers_default(model_type: str) -> str:
    """The kernel transformers runs with ``attn_implementation`` unset: SDPA, else eager."""
    return "eager" if missing_kernel(model_type, "sdpa") else "sdpa"
