"""LoRA target names: what a ``--targets`` value selects in a model, and PEFT's conversion of MoE expert
names onto transformers 5's fused expert stacks.

PEFT (peft/utils/transformers_weight_conversion.py ``_convert_peft_config_moe``, called by
``BaseTuner.inject_adapter`` under transformers >= 5) rewrites a config written for v4 names when the model
type maps to the "qwen2_moe" or "mixtral" pattern: a target equal to, or ending in ``.`` +, an old expert
name leaves ``target_modules`` and becomes a parameter target on the fused stack; naming one half of a fused
stack raises ValueError. What an adapted stack costs: estimator/fused_expert_lora.py.
"""

from __future__ import annotations

from tuneplan.errors import TuneplanError
from tuneplan.specs.model import ModelSpec

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



def resolve_targets(model: ModelSpec, targets: str | None) -> frozenset[str]:
    """LoRA target names -> the set of linear module names they select in this model."""
    if not targets:
        return frozenset()
    wanted_text = targets.strip()
    # a name both a dense layer's nn.Linear and a MoE layer's expert keeps the dense role (linear_roles)
    roles = model.linear_roles
    names = list(roles)
    # transformers 5 stores routed experts as fused 3-D parameters and the routers as TopK-router modules,
    # neither an nn.Linear, so the nn.Linear names (LLaMA-Factory's "all" lists them) leave them alone:
    # attention, dense and shared-expert linears (simulate: Mixtral / Qwen3-MoE all-linear, the names
    # passed). Where those names include gate_proj / up_proj / down_proj (DeepSeek's dense first layer and
    # shared experts), PEFT moves them onto the fused experts (lora_targets, fused_expert_lora.py). PEFT
    # given the literal string "all-linear" adds the experts and the router on every converted type
    # (_resolve_string_target_modules), which this list does not follow. Qwen2-MoE's shared_expert_gate
    # is a real nn.Linear and stays.
    if wanted_text in ("all-linear", "all"):
        return frozenset(n for n in names
                         if roles[n] != "expert" and not (roles[n] == "router" and n == "gate"))
    if wanted_text == "attn":
        return frozenset(n for n in names if roles[n] == "attn")
    if wanted_text == "mlp":
        # the routed experts' projections too: PEFT moves their names onto transformers 5's fused expert
        # stacks (estimator/fused_expert_lora.py), LitGPT's MoE has an adapted nn.Linear per expert
        return frozenset(n for n in names if roles[n] in ("mlp", "shared_expert", "expert"))
    wanted = [x.strip() for x in wanted_text.split(",") if x.strip()]
    aliases = {"output_proj": "o_proj", "query": "query", "value": "value"}
    chosen: set[str] = set()
    for name in wanted:
        module = aliases.get(name, name) if name not in names else name
        hits = [n for n in names if n == module or n.endswith("." + module)]
        if not hits and name == "output_proj":
            hits = [n for n in names if roles[n] == "attn" and n in ("dense", "wo", "c_proj")]
        if not hits:
            raise TuneplanError(f"module {name!r} is not a linear layer of {model.name}", field="targets",
                                accepted=", ".join(names) + ", or all-linear / attn / mlp")
        chosen.update(hits)
    return frozenset(chosen)


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


def adapted_targets(model: ModelSpec, targets: str | None, model_code: str) -> frozenset[str]:
    """The targets as PEFT adapts them: :func:`resolve_targets`, then :func:`convert_targets`."""
    return convert_targets(model, resolve_targets(model, targets), model_code)


def adapted_stacks(model: ModelSpec, targets: str | None, model_code: str) -> list[str]:
    """The fused expert stacks (gate_up_proj / down_proj) PEFT adapts for these targets, sorted."""
    return sorted(t.removeprefix(STACK_MARK) for t in adapted_targets(model, targets, model_code)
                  if t.startswith(STACK_MARK))
