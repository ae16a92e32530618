"""PEFT's bitsandbytes LoRA layers under autocast: ``Linear4bit.forward`` / ``Linear8bitLt.forward``
(peft/tuners/lora/bnb.py) cast the adapter's input to the adapter dtype only when autocast is off
(``requires_conversion = not torch.is_autocast_enabled()``), so an fp32 adapter reads the 16-bit input
itself and autocast's F.linear saves that same storage: no private copy per adapter
(estimator/layer_walk.py, LayerWalk.linear)."""

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


def test_qlora_adapters_share_their_16_bit_inputs_under_autocast() -> None:
    # Mistral-7B (h 4096, 32 heads and 8 KV heads of 128, MLP 14336), QLoRA r8 on all seven linears, no
    # dropout, LLaMA-Factory under fp16 autocast (fp32 adapters, fp16 residual), SDPA; per token (bytes):
    #   input RMSNorm: fp32 input 4 x 4096 + rstd 4; its fp16 output 2 x 4096, read by q, k, v and their
    #   adapters alike; three lora_A outputs 3 x 2 x 8
    #   SDPA: q 2 x 4096, k and v 2 x 2 x 1024 (grouped), output 2 x 4096 (o_proj's and its adapter's
    #   input), log-sum-exp 4 x 32; o_proj's lora_A output 2 x 8
    #   post-attention RMSNorm: 4 x 4096 + 4, its output 2 x 4096 for gate, up and their adapters; two
    #   lora_A outputs 2 x 2 x 8
    #   MLP: gate, SiLU out, up and their product (down's and its adapter's input) 4 x 2 x 14336; down's
    #   lora_A output 2 x 8
    # (with a private 16-bit copy per adapter it would be 6 x 2 x 4096 + 2 x 14336 more)
    spec = reduced_model("mistralai/Mistral-7B-v0.1", 2)
    s = resolve_setup(build_setup(spec, method="qlora", precision="fp16-mixed", framework="llamafactory",
                                  batch=1, seq=256, rank=8, targets="all-linear", attn="sdpa", dropout=0.0,
                                  gradient_checkpointing=False), spec)
    dt = resolve_dtypes(s, get_profile("llamafactory"))
    assert dt.autocast and dt.adapter == 4 and dt.residual == 2
    acts = layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "sdpa", False)
    expected = (4 * 4096 + 4 + 2 * 4096 + 3 * 2 * 8
                + 2 * 4096 + 2 * 2 * 1024 + 2 * 4096 + 4 * 32 + 2 * 8
                + 4 * 4096 + 4 + 2 * 4096 + 2 * 2 * 8
                + 4 * 2 * 14336 + 2 * 8)
    assert acts.per_token == expected == 184_568
