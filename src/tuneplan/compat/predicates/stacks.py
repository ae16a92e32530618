"""Predicates of the software stack and the job: PyTorch builds, drivers, vendor stacks, several GPUs."""

from __future__ import annotations

from typing import Any

from tuneplan.compat.predicates.base import Hit, predicate, sm_name
from tuneplan.compat.rules import (
    Context,
    arch_covered,
    table_arch_list,
    torch_install_hint,
)
from tuneplan.specs.hardware import GIB

# ---- PyTorch builds and drivers ---------------------------------------------------------------------


@predicate("torch-arch-missing")
def _torch_arch(ctx: Context, p: dict[str, Any]) -> Hit:
    if not ctx.known or ctx.platform != "cuda" or ctx.cc is None or not ctx.raw("torch_cuda"):
        return None
    archs = list(ctx.raw("torch_arch_list") or []) or table_arch_list(ctx.raw("torch"), ctx.raw("torch_cuda"))
    if not archs or arch_covered(ctx.cc, archs):
        return None
    return {
        "torch": ctx.raw("torch"),
        "torch_cuda": ctx.raw("torch_cuda"),
        "sm": sm_name(ctx.cc),
        "arch_list": " ".join(archs),
        "torch_fix": torch_install_hint(ctx.acc, ctx.versions),
    }


@predicate("torch-legacy-wheels")
def _torch_legacy(ctx: Context, p: dict[str, Any]) -> Hit:
    if ctx.known or ctx.platform != "cuda" or ctx.cc is None or ctx.cc >= (7, 5):
        return None
    note = p["cu128_note"].get(str(ctx.cc[0]), "no cu128 build has it")
    return {"sm": sm_name(ctx.cc), "cu128_note": note}


@predicate("torch-blackwell-wheels")
def _torch_blackwell(ctx: Context, p: dict[str, Any]) -> Hit:
    if ctx.known or ctx.platform != "cuda" or ctx.cc is None or ctx.cc < (10, 0):
        return None
    return {"sm": sm_name(ctx.cc)}


@predicate("torch-no-gpu-build")
def _torch_cpu(ctx: Context, p: dict[str, Any]) -> Hit:
    if not ctx.known or ctx.platform not in ("cuda", "rocm", "npu"):
        return None
    torch = ctx.raw("torch")
    if ctx.platform == "npu":
        what = (
            None
            if ctx.raw("torch_npu")
            else "torch_npu is not installed (PyTorch alone has no Ascend backend)"
        )
    elif not torch:
        what = "PyTorch is not installed"
    elif ctx.platform == "cuda" and not ctx.raw("torch_cuda"):
        what = f"PyTorch {torch} is a {'ROCm' if ctx.raw('torch_hip') else 'CPU-only'} build"
    elif ctx.platform == "rocm" and not ctx.raw("torch_hip"):
        what = f"PyTorch {torch} is a {'CUDA' if ctx.raw('torch_cuda') else 'CPU-only'} build"
    else:
        what = None
    return {"what": what, "torch_fix": torch_install_hint(ctx.acc, ctx.versions)} if what else None


@predicate("torch-npu-mismatch")
def _torch_npu(ctx: Context, p: dict[str, Any]) -> Hit:
    npu, torch = ctx.ver("torch_npu"), ctx.ver("torch")
    if not ctx.known or npu is None or torch is None or npu[0] != 2:  # pip torch_npu mirrors torch 2.x
        return None
    if npu[:3] == torch[:3]:
        return None
    return {"torch_npu": ctx.raw("torch_npu"), "torch": ctx.raw("torch"), "want": ".".join(map(str, npu[:3]))}


@predicate("driver-too-old")
def _driver(ctx: Context, p: dict[str, Any]) -> Hit:
    if not ctx.known or ctx.platform != "cuda":
        return None
    driver, cuda = ctx.ver("driver"), ctx.ver("torch_cuda")
    if driver is None or cuda is None:
        return None
    need = p["min_driver"].get(str(cuda[0]))
    if need is None or driver[0] >= int(need):
        return None
    return {"torch_cuda": ctx.raw("torch_cuda"), "need": need, "driver": ctx.raw("driver")}


# ---- vendor stacks and multi-GPU ----------------------------------------------------------------------


@predicate("ascend-stack")
def _ascend(ctx: Context, p: dict[str, Any]) -> Hit:
    return {} if ctx.platform == "npu" else None


@predicate("rocm-stack")
def _rocm(ctx: Context, p: dict[str, Any]) -> Hit:
    return {"target": ctx.card.arch_target or "unknown gfx target"} if ctx.platform == "rocm" else None


@predicate("multi-device-package")
def _package(ctx: Context, p: dict[str, Any]) -> Hit:
    if ctx.acc is None or ctx.card.devices_per_package <= 1:
        return None
    return {"n": ctx.card.devices_per_package, "mem_gib": f"{ctx.card.memory_bytes / GIB:.1f}"}


@predicate("multi-gpu-no-fast-link")
def _no_link(ctx: Context, p: dict[str, Any]) -> Hit:
    s = ctx.setup
    if ctx.acc is None or s.gpus < 2 or s.device_map != "none" or ctx.card.has_fast_link is not False:
        return None
    traffic = (
        " and ZeRO-3/FSDP parameter all-gathers"
        if s.zero == 3 or s.fsdp
        else " and ZeRO gradient reduce-scatter"
        if s.zero
        else ""
    )
    return {"interconnect": ctx.card.interconnect, "zero_traffic": traffic, "n": s.gpus}


@predicate("qlora-sharded-quant-storage")
def _quant_storage(ctx: Context, p: dict[str, Any]) -> Hit:
    s = ctx.setup
    if s.method != "qlora" or s.quant_bits != 4 or not (s.zero == 3 or s.fsdp):
        return None
    if s.framework == "fsdp-qlora":
        return None  # its train.py builds Linear4bit(quant_storage=torch_dtype) itself
    return {"sharding": "FSDP" if s.fsdp else "DeepSpeed ZeRO-3"}


@predicate("fsdp-qlora-layer-classes")
def _fsdp_qlora_layers(ctx: Context, p: dict[str, Any]) -> Hit:
    model = ctx.model
    if ctx.setup.framework != "fsdp-qlora" or model is None or model.model_type in ("llama", "mistral"):
        return None
    return {"model_type": model.model_type}


@predicate("adafactor-fsdp2")
def _adafactor_fsdp2(ctx: Context, p: dict[str, Any]) -> Hit:
    """Adafactor (transformers' class under every profile that offers it) over FSDP2's DTensor parameters
    (``fully_shard`` makes them DTensors on one GPU too)."""
    s = ctx.setup
    if s.optimizer != "adafactor" or not s.fsdp or s.fsdp_version != 2:
        return None
    return {}


@predicate("moe-fused-target-partial")
def _moe_fused_partial(ctx: Context, p: dict[str, Any]) -> Hit:
    """LoRA naming one half of a fused expert stack on a MoE type PEFT converts for transformers 5
    (specs/lora_targets.py partial_fused)."""
    s, model = ctx.setup, ctx.model
    if model is None or not s.is_lora or not model.is_moe:
        return None  # before the imports: every estimate asks, few are MoE LoRA runs
    from tuneplan.errors import TuneplanError
    from tuneplan.specs.lora_targets import partial_fused, resolve_targets
    from tuneplan.specs.profiles import get_profile

    try:
        names = resolve_targets(model, s.targets)
    except TuneplanError:
        return None  # the targets' own error says why
    hit = partial_fused(model, names, get_profile(s.framework).model_code)
    if hit is None:
        return None
    return {"named": hit[0], "missing": hit[1], "stack": hit[2], "model_type": model.model_type}


def _fsdp1_sharded(ctx: Context) -> bool:
    s = ctx.setup
    return bool(s.fsdp) and s.fsdp_version == 1 and s.gpus > 1 and s.device_map == "none"


@predicate("fsdp1-lora-fused-experts")
def _fsdp1_lora_experts(ctx: Context, p: dict[str, Any]) -> Hit:
    """LoRA reaching transformers 5's fused 3-D expert parameters under FSDP1.

    PEFT (utils/transformers_weight_conversion.py ``_convert_peft_config_moe``) turns an expert name in
    ``target_modules`` (gate_proj/up_proj/down_proj, Mixtral's w1/w2/w3) into ``target_parameters`` on the
    fused ``experts`` module (``ParamWrapper``). The Trainer's FSDP1 wrap policy for a PEFT model (PEFT
    ``fsdp_auto_wrap_policy``: every trainable leaf module) makes each ``lora_A`` / ``lora_B`` its own FSDP
    unit, unsharded only when its own ``forward`` runs; ``ParamWrapper.get_delta_factors`` reads their
    ``.weight`` without calling it, so it sees FSDP1's 1-D sharded view (use_orig_params) and the
    ``reshape(num_experts, -1, in)`` fails."""
    model, s = ctx.model, ctx.setup
    if model is None or not model.is_moe or s.method not in ("lora", "qlora") or not _fsdp1_sharded(ctx):
        return None
    from tuneplan.specs.lora_targets import adapted_stacks
    from tuneplan.specs.profiles import get_profile, peft_default_targets

    hit = adapted_stacks(model, s.targets or peft_default_targets(model), get_profile(s.framework).model_code)
    if not hit:
        return None
    return {"names": ", ".join(hit)}


@predicate("fsdp1-tied-embeddings-unit")
def _fsdp1_tied_embeddings(ctx: Context, p: dict[str, Any]) -> Hit:
    """An encoder's masked-LM head tied to word embeddings that FSDP1 wraps as their own unit.

    The Trainer's FSDP1 wrap policy (accelerate ``set_auto_wrap_policy``; PEFT ``fsdp_auto_wrap_policy``)
    wraps the classes in ``_no_split_modules``; BERT-like models list their ``*Embeddings`` there, so
    ``word_embeddings.weight`` is flattened into that unit, resharded after its forward, and the MLM
    head's ``decoder`` (the same Parameter, in the root unit) multiplies by FSDP1's 1-D sharded view."""
    model, s = ctx.model, ctx.setup
    if (model is None or model.architecture != "encoder" or not model.tied_embeddings or s.num_labels
            or model.model_type not in p["embeddings_unit_types"] or not _fsdp1_sharded(ctx)):
        return None
    return {"model_type": model.model_type}


@predicate("moe-fused-target-dropout")
def _moe_fused_dropout(ctx: Context, p: dict[str, Any]) -> Hit:
    """LoRA dropout on a fused expert stack: PEFT's ``lora.ParamWrapper.__init__`` raises
    (peft/tuners/lora/layer.py: lora_B(lora_A(dropout(x))) cannot be factored out of the stacked weight)."""
    s, model = ctx.setup, ctx.model
    if model is None or not s.is_lora or not model.is_moe:
        return None  # before the imports: every estimate asks, few are MoE LoRA runs
    from tuneplan.errors import TuneplanError
    from tuneplan.specs.lora_targets import adapted_stacks
    from tuneplan.specs.profiles import get_profile

    prof = get_profile(s.framework)
    dropout = s.dropout if s.dropout is not None else prof.default_dropout
    if not dropout:
        return None
    try:
        stacks = adapted_stacks(model, s.targets, prof.model_code)
    except TuneplanError:
        return None  # the targets' own error says why
    if not stacks:
        return None
    return {"stacks": ", ".join(stacks), "dropout": dropout, "model_type": model.model_type}


def _fp32_router_layers(ctx: Context, p: dict[str, Any]) -> tuple[list[bool], list[bool]] | None:
    """Per decoder layer of a model whose routers transformers keeps in fp32 (``_keep_in_fp32_modules_strict
    = ["gate.weight", ...]``: upcast whenever the model loads in fp16 / bf16, modeling_utils
    ``_get_dtype_plan``): whether the layer holds the router beside 16-bit weights, (frozen, trained).

    None where no layer does: another model type, other model code, or a model loaded in fp32. Trained
    layers hold 16-bit weights unless a ``-mixed`` precision upcasts trainable parameters to fp32."""
    from tuneplan.specs.load_precision import loads_fp32
    from tuneplan.specs.profiles import get_profile

    model, s = ctx.model, ctx.setup
    if model is None or not model.is_moe or model.model_type not in p["fp32_router_types"]:
        return None
    prof = get_profile(s.framework)
    if prof.model_code != "hf" or loads_fp32(s, prof):
        return None
    moe = [spec.moe for spec, count in model.layer_groups for _ in range(count)]
    first_trained = {"full": 0, "freeze": len(moe) - s.freeze_trainable_layers}.get(s.method, len(moe))
    trained_16 = not (s.precision.endswith("-mixed") and prof.trainable_fp32_in_mixed)
    frozen = [m and i < first_trained for i, m in enumerate(moe)]
    trained = [m and i >= first_trained and trained_16 for i, m in enumerate(moe)]
    return frozen, trained


@predicate("fsdp1-fp32-router")
def _fsdp1_fp32_router(ctx: Context, p: dict[str, Any]) -> Hit:
    """FSDP1 flattens each unit's parameters into one FlatParameter of one dtype (torch
    distributed/fsdp/_flat_param.py ``_validate_tensors_to_flatten``: 'Must flatten tensors with uniform
    dtype'); a decoder layer (the wrap unit) holding an fp32 router beside 16-bit weights cannot be wrapped.
    PEFT's adapters are units of their own (PEFT ``fsdp_auto_wrap_policy``), so they do not mix in."""
    if not _fsdp1_sharded(ctx):
        return None
    layers = _fp32_router_layers(ctx, p)
    if layers is None or not any(layers[0] + layers[1]):
        return None
    return {"model_type": ctx.model.model_type if ctx.model else "", "dtype": ctx.setup.precision[:4]}


@predicate("fsdp2-fp32-router-trainable")
def _fsdp2_fp32_router(ctx: Context, p: dict[str, Any]) -> Hit:
    """FSDP2 asks one original dtype of a parameter group's trainable parameters (torch
    distributed/fsdp/_fully_shard/_fsdp_param_group.py ``_init_mp_dtypes``: 'FSDP expects uniform original
    parameter dtype'); frozen parameters may mix, so only a trained layer with its fp32 router fails.
    Where accelerate's mixed_precision is not "no", ``fsdp2_prepare_model`` first upcasts every trainable
    parameter to fp32 (``fsdp_mixed_precision``), and nothing mixes."""
    s = ctx.setup
    if not (s.fsdp and s.fsdp_version == 2 and s.gpus > 1 and s.device_map == "none"):
        return None  # before the imports: every estimate asks, few are FSDP2 runs
    from tuneplan.specs.load_precision import fsdp_mixed_precision
    from tuneplan.specs.profiles import get_profile

    if fsdp_mixed_precision(s, get_profile(s.framework)):
        return None
    layers = _fp32_router_layers(ctx, p)
    if layers is None or not any(layers[1]):
        return None
    return {"model_type": ctx.model.model_type if ctx.model else "", "dtype": s.precision[:4]}
