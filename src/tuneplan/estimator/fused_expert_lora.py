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

from tuneplan.specs.model import LayerSpec, ModelSpec

# transformers conversion_mapping._MODEL_TO_CONVERSION_PATTERN, the MoE rows (plus PEFT's "mixtral" row)
CONVERSION_PATTERN: dict[str, str] = {
    "mixtral": "mixtral", "minimax": "mixtral", "minimax_m2": "mixtral",
    **{t: "qwen2_moe" for t in (
        "afmoe", "deepseek_v2", "deepseek_v3", "deepseek_v32", "dots1", "ernie4_5_moe", "glm4_moe",
        "glm4_moe_lite", "glm_moe_dsa", "glm4v_moe", "longcat_flash", "solar_open", "mellum", "qwen3_moe",
        "beam", "qwen3_omni_moe", "qwen3_omni_moe_thinker", "qwen3_omni_moe_text", "qwen3_next",
        "hunyuan_v1_moe", "flex_olmo", "olmoe", "sarvam_mla", "exaone_moe", "cohere2_moe")},
}
# PEFT _MOE_TARGET_MODULE_MAPPING (the expert rows; "gate" -> "gate.weight" stays a module name here)
STACK_OF: dict[str, dict[str, str]] = {
    "mixtral": {"w1": "gate_up_proj", "w3": "gate_up_proj", "w2": "down_proj"},
    "qwen2_moe": {"gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj"},
}
STACK_MARK = "experts@"  # a converted target: "experts@gate_up_proj", "experts@down_proj"


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


def conversion_pattern(model: ModelSpec, model_code: str) -> str | None:
    """The PEFT conversion pattern of ``model`` when PEFT wraps transformers' own model code, else None."""
    if model_code != "hf" or not model.is_moe:
        return None
    return CONVERSION_PATTERN.get(model.model_type)


def partial_fused(model: ModelSpec, names: frozenset[str], model_code: str) -> tuple[str, str, str] | None:
    """(the named halves, the missing halves, the stack) of a fused stack named in part, which PEFT refuses
    (ValueError "Cannot convert PEFT target(s) ... without also targeting ..."); None when there is none."""
    pattern = conversion_pattern(model, model_code)
    if pattern is None:
        return None
    stack_of = STACK_OF[pattern]
    named = {n.rsplit(".", 1)[-1] for n in names} & stack_of.keys()
    for stack in sorted(set(stack_of.values())):
        olds = {old for old, new in stack_of.items() if new == stack}
        if named & olds and not olds <= named:
            return ", ".join(sorted(named & olds)), ", ".join(sorted(olds - named)), stack
    return None


def convert_targets(model: ModelSpec, names: frozenset[str], model_code: str) -> frozenset[str]:
    """The targets as PEFT adapts them: names whose last part is an old expert name leave (dense and shared
    linears of that name included) and the fused stacks they map to enter as ``STACK_MARK + stack`` (a
    stack named in part, which PEFT refuses, is counted as adapted: compat rule moe-fused-target-partial)."""
    pattern = conversion_pattern(model, model_code)
    if model_code == "hf" and model.is_moe and pattern is None:
        # no conversion (Qwen2-MoE): a name only routed experts carry matches no nn.Linear, as transformers 5
        # fuses them into 3-D parameters; PEFT adapts what else bears it (the shared expert's)
        linear_only_expert = {m.name for spec, _ in model.layer_groups for m in spec.linears
                              if m.role == "expert"} - {m.name for spec, _ in model.layer_groups
                                                          for m in spec.linears if m.role != "expert"}
        return names - linear_only_expert
    if pattern is None or not names:
        return names
    stack_of = STACK_OF[pattern]
    named = {n.rsplit(".", 1)[-1] for n in names} & stack_of.keys()
    if not named:
        return names
    kept = {n for n in names if n.rsplit(".", 1)[-1] not in stack_of}
    return frozenset(kept | {STACK_MARK + stack_of[old] for old in named})


def expert_stacks(spec: LayerSpec, targets: frozenset[str], rank: int) -> list[ExpertStack]:
    """The adapted fused stacks of one layer: gate_up_proj [E, 2f, h] at rank 2r (both halves' ranks),
    down_proj [E, h, f] at rank r."""
    experts = [m for m in spec.linears if m.role == "expert"]
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
