"""LoRA on transformers 5's fused MoE experts: PEFT's target conversion and what an adapted stack costs.

transformers 5 keeps a MoE layer's routed experts as two 3-D parameters, ``gate_up_proj`` [E, 2f, h] and
``down_proj`` [E, h, f]. PEFT (peft/utils/transformers_weight_conversion.py ``_convert_peft_config_moe``,
called by ``BaseTuner.inject_adapter`` under transformers >= 5) rewrites a config written for v4 names when
the model type maps to the "qwen2_moe" or "mixtral" pattern (transformers conversion_mapping
``_MODEL_TO_CONVERSION_PATTERN``, plus PEFT's own ``"mixtral": "mixtral"`` entry; qwen2_moe itself is a
pattern, not a key, so Qwen2-MoE is left alone):

- every target equal to, or ending in ``.`` +, an old name of ``_MOE_TARGET_MODULE_MAPPING`` (gate_proj /
  up_proj / down_proj; Mixtral w1 / w3 / w2) leaves ``target_modules`` and becomes a parameter target on the
  fused stack (gate_up_proj / down_proj): the dense MLPs and shared experts, whose nn.Linear share those
  names, keep no adapter at all;
- ``gate_up_proj`` fuses two old targets (``_MOE_FUSED_TARGETS``): rank 2r and alpha 2 alpha
  (rank_pattern / alpha_pattern); naming one without the other raises ValueError ("Cannot convert PEFT
  target(s) ... without also targeting ...");
- the router's "gate" maps to the parameter ``gate.weight`` (a 2-D ParamWrapper: r (h + E) parameters, as
  a lora.Linear would have), so it stays a module name here.

A ``lora.ParamWrapper`` (peft/tuners/lora/layer.py) on a stack of E experts adds lora_A [r E, d_in] and
lora_B [d_out, r E]: r E (d_in + d_out) parameters. Its forward (``_activate_lora``) registers a
``_LoraFactorsProxy`` parametrization, which folds ``W + s B A`` into one ``baddbmm`` in W's dtype: a new
effective weight the size of the stack, which the experts' grouped_mm saves for the input gradient
(whenever its input needs one), and the factors' casts ``.to(W.dtype)``, which baddbmm saves. The backward
makes grouped_mm's weight gradient [E, d_out, d_in] in W's dtype, one stack at a time, before baddbmm's
backward reduces it to the factors' gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.specs.lora_targets import STACK_MARK
from tuneplan.specs.model import LayerSpec


@dataclass(frozen=True)
class ExpertStack:
    """One fused expert parameter a ParamWrapper adapts, in one MoE layer."""

    name: str  # gate_up_proj | down_proj
    experts: int
    d_in: int
    d_out: int
    rank: int

    @property
    def weight_numel(self) -> int:
        return self.experts * self.d_in * self.d_out

    @property
    def adapter_params(self) -> int:
        """lora_A [r E, d_in] + lora_B [d_out, r E]."""
        return self.rank * self.experts * (self.d_in + self.d_out)


def expert_stacks(spec: LayerSpec, targets: frozenset[str], rank: int) -> list[ExpertStack]:
    """The adapted fused stacks of one layer: gate_up_proj [E, 2f, h] at rank 2r (both halves' ranks),
    down_proj [E, h, f] at rank r."""
    experts = spec.expert_linears
    if not experts or not any(t.startswith(STACK_MARK) for t in targets):
        return []
    up = [m for m in experts if m.reads == "mlp_in"]
    down = [m for m in experts if m.reads == "mlp_mid"]
    out = []
    if up and STACK_MARK + "gate_up_proj" in targets:
        out.append(ExpertStack("gate_up_proj", up[0].count, up[0].d_in, sum(m.d_out for m in up),
                               rank * len(up)))
    if down and STACK_MARK + "down_proj" in targets:
        out.append(ExpertStack("down_proj", down[0].count, down[0].d_in, down[0].d_out, rank))
    return out
