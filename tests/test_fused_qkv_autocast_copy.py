"""A fused q/k/v projection whose output is wider than the compute dtype: Phi-3's ``qkv_proj`` under
bitsandbytes, which casts its output back to the fp32 residual's dtype (``Linear4bit.forward``). Autocast
casts q, k and v for ``scaled_dot_product_attention`` (a lower_precision_fp op), so the kernel saves the
16-bit copy of v, not the view that would keep the fused fp32 buffer alive (estimator/attention_saved.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.activations import layer_activations  # noqa: E402
from tuneplan.estimator.dtypes import resolve_dtypes  # noqa: E402
from tuneplan.specs.lora_targets import resolve_targets  # noqa: E402
from tuneplan.specs.profiles import get_profile, resolve_setup  # noqa: E402


def test_phi3_qlora_sdpa_saves_a_16_bit_v() -> None:
    # Phi-3-mini (h 3072, 32 heads of 96, MLP 8192), QLoRA r8 on the attention, fp16 autocast, SDPA; per
    # token of a layer whose input needs a gradient (bytes; v alone was 4 x 9216, the fused fp32 qkv):
    #   input RMSNorm: fp32 input 4 x 3072 + rstd 4; qkv_proj's adapter: fp16 input 2 x 3072, lora_A out 2 x 8
    #   SDPA: fp16 q, k, v 3 x 2 x 3072 (autocast's casts), output 2 x 3072, fp32 log-sum-exp 4 x 32
    #   o_proj's adapter: its input is the SDPA output (one storage: PEFT's bitsandbytes layer does not cast
    #   it under autocast), lora_A out 2 x 8
    #   post-attention RMSNorm: fp32 input 4 x 3072 + rstd 4
    #   MLP (bitsandbytes outputs cast back to fp32): gate, SiLU out, up 3 x 4 x 8192
    spec = reduced_model("microsoft/Phi-3-mini-4k-instruct", 2)
    s = resolve_setup(build_setup(spec, method="qlora", precision="fp16-mixed", framework="hf", batch=1,
                                  seq=384, rank=8, targets="attn", attn="sdpa",
                                  gradient_checkpointing=False), spec)
    dt = resolve_dtypes(s, get_profile("hf"))
    assert dt.autocast and dt.quant_out == 4
    acts = layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "sdpa", True)
    expected = (4 * 3072 + 4 + 2 * 3072 + 2 * 8 + 3 * 2 * 3072 + 2 * 3072 + 4 * 32 + 2 * 8
                + 4 * 3072 + 4 + 3 * 4 * 8192)
    assert acts.per_token == expected == 153_768
