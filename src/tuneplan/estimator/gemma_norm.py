"""Gemma's RMSNorm: what it keeps for a trained weight's gradient.

transformers' ``GemmaRMSNorm`` (models/gemma/modeling_gemma.py, copied into Gemma 2 and Gemma 3, whose
per-head ``q_norm`` / ``k_norm`` are the same class) scales in fp32 and casts last::

    output = self._norm(x.float())                 # x32 * rsqrt(mean(x32^2) + eps), fp32
    output = output * (1.0 + self.weight.float())  # MulBackward0 keeps ``output`` when the weight trains
    return output.type_as(x)

where LlamaRMSNorm casts first (``weight * hidden.to(input_dtype)``, keeping the 16-bit cast). A trained
Gemma norm therefore keeps its normalized output in fp32: :math:`4 w` bytes per token for a width
:math:`w`, not :math:`b_{norm} w`; ``1 + weight`` is a w-sized fp32 tensor per norm, whatever the tokens.
"""

from __future__ import annotations

from tuneplan.specs.model import ModelSpec

# transformers model types whose RMSNorm is GemmaRMSNorm (or a copy of it)
GEMMA_NORM_MODEL_TYPES = ("gemma", "gemma2", "gemma3", "gemma3_text")


def norm_output_bytes(model: ModelSpec, norm_out: int) -> int:
    """Bytes per element of the normalized output a trained RMSNorm keeps: fp32 (4) in Gemma's code,
    else the norm's output dtype ``norm_out``."""
    return 4 if model.model_type in GEMMA_NORM_MODEL_TYPES else norm_out
