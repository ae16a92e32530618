"""Transients of the kernels that compute with a quantized weight, beyond the weight's own storage.

torchao ``NF4Tensor`` (the base of torchtune's QLoRA; ``torchtune.modules.low_precision`` /
``torchao.dtypes.nf4tensor``): ``linear_nf4`` calls ``F.linear(input, weight.to(input.dtype))`` in forward
and again for the input gradient in backward. ``weight.to`` runs ``get_original_weight()``, which unpacks
the two 4-bit codes of every byte with ``.to(torch.long)`` (int64: 4 bytes per weight element for each of
the two halves), looks both up in the NF4 table (1 + 1 bytes per element in 16 bits), scales each half
(1 + 1) and stacks the halves into the 16-bit weight (2): 14 bytes per element of the weight live at the
stack, per linear, while that linear runs. The largest quantized linear sets the peak.
bitsandbytes' ``MatMul4Bit`` dequantizes into a 16-bit weight only (``dequantize_4bit``), which the HF
path already checks against the simulate engine; its profiles leave this at 0.
"""

from __future__ import annotations

from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import Profile
from tuneplan.specs.setup import TrainSetup

COMPILED_DEQUANT_BYTES = 2.0  # the bf16 weight a fused dequantization kernel writes


def dequant_transient_bytes(model: ModelSpec, setup: TrainSetup, prof: Profile) -> int:
    """Bytes live while the largest quantized linear dequantizes its weight (0 when nothing is quantized)."""
    if setup.quant_bits is None or not prof.dequant_bytes_per_elem:
        return 0
    largest = max((m.d_in * m.d_out for spec, _ in model.layer_groups for m in spec.linears), default=0)
    # under FSDP the unit is gathered first, so every GPU dequantizes the whole weight too
    per_elem = prof.dequant_bytes_per_elem
    if setup.compile:
        # torch.compile fuses get_original_weight's unpack / lookup / scale / stack into one kernel that
        # writes the 16-bit weight: its intermediates are never materialised
        per_elem = min(per_elem, COMPILED_DEQUANT_BYTES)
    return int(per_elem * largest)
