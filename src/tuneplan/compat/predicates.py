"""One small predicate per compatibility rule (same code as in catalog/compat_rules.toml).

A predicate gets the Context and the rule's ``params`` and returns None (rule does not apply) or the
values its message/fix templates need; ``"_unknown": True`` selects the rule's versions-unknown text.
Thresholds and facts live in the rules file; what is here is only the logic that joins them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuneplan.compat.rules import (
    BNB_OPTIMIZERS,
    Context,
    arch_covered,
    rule,
    rule_cc,
    rule_version,
    table_arch_list,
    torch_install_hint,
)
from tuneplan.specs.hardware import GIB
from tuneplan.specs.profiles import get_profile

Hit = dict[str, Any] | None
PREDICATES: dict[str, Callable[[Context, dict[str, Any]], Hit]] = {}


def predicate(code: str) -> Callable[[Callable[[Context, dict[str, Any]], Hit]], Callable[..., Hit]]:
    def deco(fn: Callable[[Context, dict[str, Any]], Hit]) -> Callable[..., Hit]:
        PREDICATES[code] = fn
        return fn

    return deco


def _sm(cc: tuple[int, int] | None) -> str:
    return f"{cc[0]}{cc[1]}" if cc else "?"


def _bnb_what(ctx: Context) -> str:
    return (
        f"{ctx.setup.quant_bits}-bit QLoRA"
        if ctx.setup.method == "qlora"
        else f"--optimizer {ctx.setup.optimizer}"
    )


# ---- hardware -------------------------------------------------------------------------------------


@predicate("hardware-unknown")
def _hardware_unknown(ctx: Context, p: dict[str, Any]) -> Hit:
    a = ctx.acc
    if a is None:
        return None
    if a.platform == "unknown":
        return {
            "missing": f"software stack (vendor {a.vendor!r})",
            "missing_key": "vendor (NVIDIA, AMD or Huawei)",
        }
    if a.platform == "cuda" and a.compute_capability is None:
        return {"missing": "compute capability", "missing_key": 'compute_capability = "X.Y"'}
    if a.platform in ("rocm", "npu") and a.arch_target is None:
        return {"missing": "gfx target / SoC family", "missing_key": 'compute_target (e.g. "gfx942")'}
    return None


@predicate("no-tensor-cores")
def _no_tensor_cores(ctx: Context, p: dict[str, Any]) -> Hit:
    if ctx.cap("tensor_cores") is not False:
        return None
    slow = ctx.card.cc_str in p["slow_fp16_cc"]
    return {
        "fp32": ctx.card.fp32_tflops if ctx.card.fp32_tflops is not None else "unknown",
        "slow_fp16": f"; FP16 arithmetic on compute capability {ctx.card.cc_str} "
        "runs at 1/64 of the fp32 rate, "
        "so fp16/bf16 autocast is slower than fp32"
        if slow
        else "",
        "fp32_hint": "; on this card train in --precision fp32" if slow else "",
    }


@predicate("bf16-unsupported")
def _bf16(ctx: Context, p: dict[str, Any]) -> Hit:
    if not ctx.setup.precision.startswith("bf16") or ctx.cap("bf16") is not False:
        return None
    why = {"cuda": p["cuda_why"], "npu": p["npu_why"]}.get(ctx.platform or "", "")
    src = ctx.setup.sources.get("precision")
    origin = (
        f"; {ctx.setup.precision} is the {ctx.setup.framework} profile's default precision, "
        "not a flag you gave"
        if ctx.setup.sources and (src is None or "default" in src)
        else ""
    )
    return {
        "why": why,
        "origin": origin,
        "cost": p["cost_pure"] if ctx.setup.precision == "bf16" else p["cost_mixed"],
    }


# ---- precision (setup) ------------------------------------------------------------------------------


@predicate("fp16-pure-trainable")
def _fp16_pure(ctx: Context, p: dict[str, Any]) -> Hit:
    s = ctx.setup
    if s.precision != "fp16":
        return None
    if s.method in ("full", "freeze"):
        return {"what": f"{s.method} fine-tuning"}
    if s.is_lora and not get_profile(s.framework).adapter_fp32:
        return {"what": f"the LoRA adapters under the {s.framework} profile"}
    return None


@predicate("fp16-overflow-risk")
def _fp16_overflow(ctx: Context, p: dict[str, Any]) -> Hit:
    m = ctx.model
    if m is None or not ctx.setup.precision.startswith("fp16"):
        return None
    return {} if (m.torch_dtype or "").lower() in ("bfloat16", "bf16") else None


# ---- attention ----------------------------------------------------------------------------------------


@predicate("flash-attn-unsupported")
def _fa2(ctx: Context, p: dict[str, Any]) -> Hit:
    if ctx.setup.attn != "flash" or ctx.platform == "npu" or ctx.cap("flash_attn_2") is not False:
        return None
    return {}


@predicate("flash-attn-npu")
def _fa2_npu(ctx: Context, p: dict[str, Any]) -> Hit:
    return {} if ctx.setup.attn == "flash" and ctx.platform == "npu" else None


@predicate("flash-attn-unverified")
def _fa2_unverified(ctx: Context, p: dict[str, Any]) -> Hit:
    if ctx.setup.attn == "flash" and ctx.platform == "cuda" and ctx.cc and ctx.cap("flash_attn_2") is None:
        return {}
    return None


@predicate("flash-attn-head-dim")
def _fa2_head_dim(ctx: Context, p: dict[str, Any]) -> Hit:
    if ctx.setup.attn != "flash" or ctx.model is None or ctx.platform not in ("cuda", "rocm"):
        return None
    limit = p["rocm_limit"] if ctx.platform == "rocm" else p["cuda_limit"]
    hd = ctx.model.head_dim
    if hd <= limit:
        return None
    return {"head_dim": hd, "limit": limit, "where": p["rocm_where"] if ctx.platform == "rocm" else ""}


@predicate("flash-attn-hdim256-consumer")
def _fa2_hdim_consumer(ctx: Context, p: dict[str, Any]) -> Hit:
    if (
        ctx.setup.attn != "flash"
        or ctx.model is None
        or ctx.platform != "cuda"
        or ctx.card.cc_str not in p["consumer_cc"]
        or ctx.model.head_dim < p["min_head_dim"]
    ):
        return None
    vals = {"head_dim": ctx.model.head_dim}
    if not ctx.known:
        return {**vals, "_unknown": True}
    fa = ctx.ver("flash_attn")
    if fa is None or fa >= rule_version(p["fixed_in"]):
        return None
    return {**vals, "flash_attn": ctx.raw("flash_attn")}


@predicate("flash-attn-3-available")
def _fa3(ctx: Context, p: dict[str, Any]) -> Hit:
    return {} if ctx.setup.attn == "flash" and ctx.cap("flash_attn_3") is True else None


@predicate("flash-attn-3-not-hopper")
def _fa3_not_hopper(ctx: Context, p: dict[str, Any]) -> Hit:
    if (
        not ctx.known
        or not ctx.raw("flash_attn_3")
        or ctx.platform != "cuda"
        or ctx.cap("flash_attn_3") is not False
    ):
        return None
    return {"flash_attn_3": ctx.raw("flash_attn_3")}


@predicate("sdpa-no-flash-backend")
def _sdpa(ctx: Context, p: dict[str, Any]) -> Hit:
    if (
        ctx.setup.attn == "sdpa"
        and ctx.platform == "cuda"
        and ctx.cap("sdpa_flash") is False
        and ctx.cap("sdpa_mem_efficient") is True
    ):
        return {}
    return None


# ---- bitsandbytes -------------------------------------------------------------------------------------


@predicate("qlora-unavailable-npu")
def _qlora_npu(ctx: Context, p: dict[str, Any]) -> Hit:
    return {} if ctx.setup.method == "qlora" and ctx.platform == "npu" else None


@predicate("bnb-optimizer-unavailable-npu")
def _bnb_optim_npu(ctx: Context, p: dict[str, Any]) -> Hit:
    return {} if ctx.setup.optimizer in BNB_OPTIMIZERS and ctx.platform == "npu" else None


def _bnb_floor(floors: list[list[str]], bnb: tuple[int, ...] | None) -> tuple[tuple[int, int], str]:
    """Lowest CC covered by the wheels of ``bnb`` (None: the newest release), and that release range."""
    for i, (first, cc) in enumerate(floors):
        if bnb is None or bnb >= rule_version(first):
            newer = floors[i - 1][0] if i else None
            rng = f">= {first}" if newer is None else f"{first}-<{newer}"
            return rule_cc(cc), rng
    return rule_cc(floors[-1][1]), "any"


@predicate("bnb-arch-too-old")
def _bnb_arch(ctx: Context, p: dict[str, Any]) -> Hit:
    if not ctx.uses_bnb or ctx.platform != "cuda" or ctx.cc is None:
        return None
    if ctx.known and ctx.ver("bitsandbytes") is None:
        return None  # not installed: doctor says so; nothing is broken yet
    floor, rng = _bnb_floor(p["wheel_floors"], ctx.ver("bitsandbytes") if ctx.known else None)
    if ctx.cc >= floor:
        return None
    floors = p["wheel_floors"]
    idx = next((i for i, (_, c) in enumerate(floors) if rule_cc(c) <= ctx.cc), None)
    fix = f"pip install 'bitsandbytes<{floors[idx - 1][0]}'" if idx else "no PyPI wheel covers it"
    label = ctx.raw("bitsandbytes") if ctx.known else rng
    return {
        "what": _bnb_what(ctx),
        "bnb_range": label,
        "floor": f"{floor[0]}.{floor[1]}",
        "sm": _sm(ctx.cc),
        "bnb_fix": fix,
    }


@predicate("bnb-llm-int8-unavailable")
def _llm_int8(ctx: Context, p: dict[str, Any]) -> Hit:
    s = ctx.setup
    if (
        s.method == "qlora"
        and s.quant_bits == 8
        and ctx.platform == "cuda"
        and ctx.cap("bnb_llm_int8") is False
    ):
        return {}
    return None


def _sm70_cu128_window(ctx: Context, p: dict[str, Any]) -> bool:
    bnb, cuda = ctx.ver("bitsandbytes"), ctx.raw("torch_cuda")
    return (
        bnb is not None
        and str(cuda) in p["cuda_builds"]
        and rule_version(p["first_cu128"]) <= bnb < rule_version(p["fixed_in"])
    )


@predicate("bnb-sm70-cu128")
def _bnb_sm70(ctx: Context, p: dict[str, Any]) -> Hit:
    if not ctx.uses_bnb or ctx.platform != "cuda" or ctx.cc != (7, 0):
        return None
    if not ctx.known:
        return {"_unknown": True, "fixed_in": p["fixed_in"]}
    if not _sm70_cu128_window(ctx, p):
        return None
    return {"bnb": ctx.raw("bitsandbytes"), "torch_cuda": ctx.raw("torch_cuda"), "fixed_in": p["fixed_in"]}


@predicate("bnb-no-cuda-build")
def _bnb_no_build(ctx: Context, p: dict[str, Any]) -> Hit:
    if not ctx.known or ctx.platform != "cuda":
        return None
    bnb, cuda = ctx.ver("bitsandbytes"), str(ctx.raw("torch_cuda"))
    first = p["first_build"].get(cuda)
    if bnb is None or first is None or bnb >= rule_version(first):
        return None
    return {"bnb": ctx.raw("bitsandbytes"), "torch_cuda": cuda, "first": first}


@predicate("bnb-torch-floor")
def _bnb_torch(ctx: Context, p: dict[str, Any]) -> Hit:
    bnb, torch = ctx.ver("bitsandbytes"), ctx.ver("torch")
    if not ctx.known or bnb is None or torch is None:
        return None
    for first, floor in p["floors"]:
        if bnb >= rule_version(first):
            if torch < rule_version(floor):
                return {"bnb": ctx.raw("bitsandbytes"), "floor": floor, "torch": ctx.raw("torch")}
            return None
    return None


def bnb_problem(ctx: Context) -> str | None:
    """Why the installed bitsandbytes is broken on this card (doctor only), or None."""
    if not ctx.known or ctx.ver("bitsandbytes") is None or ctx.platform != "cuda":
        return None
    if ctx.raw("bitsandbytes_import_error"):
        return f"`import bitsandbytes` failed: {ctx.raw('bitsandbytes_import_error')}"
    if ctx.cc == (7, 0) and _sm70_cu128_window(ctx, rule("bnb-sm70-cu128").params):
        return f"bitsandbytes {ctx.raw('bitsandbytes')} with CUDA {ctx.raw('torch_cuda')} has no sm70 kernels"
    if _bnb_no_build(ctx, rule("bnb-no-cuda-build").params):
        return f"bitsandbytes {ctx.raw('bitsandbytes')} has no CUDA {ctx.raw('torch_cuda')} binary"
    if ctx.cc is not None:
        floor, _ = _bnb_floor(rule("bnb-arch-too-old").params["wheel_floors"], ctx.ver("bitsandbytes"))
        if ctx.cc < floor:
            return (f"bitsandbytes {ctx.raw('bitsandbytes')} wheels start at compute capability "
                    f"{floor[0]}.{floor[1]}")
    return None


@predicate("peft-imports-bnb")
def _peft_bnb(ctx: Context, p: dict[str, Any]) -> Hit:
    if ctx.setup.method != "lora" or ctx.uses_bnb or ctx.platform != "cuda" or ctx.cc is None:
        return None
    if not ctx.known:
        risky = ctx.card.cc_str in p["risky_cc"] or ctx.cc < (6, 0)
        return {"_unknown": True, "where": p["where"]} if risky else None
    problem = bnb_problem(ctx)
    return {"where": p["where"], "problem": problem} if problem else None


@predicate("bnb-rocm")
def _bnb_rocm(ctx: Context, p: dict[str, Any]) -> Hit:
    if not ctx.uses_bnb or ctx.platform != "rocm":
        return None
    if not ctx.known:
        return {"_unknown": True, "target": ctx.card.arch_target or "an unknown target"}
    bnb = ctx.ver("bitsandbytes")
    if bnb is None or bnb >= rule_version(p["official_from"]):
        return None
    return {"bnb": ctx.raw("bitsandbytes"), "what": _bnb_what(ctx)}


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
        "sm": _sm(ctx.cc),
        "arch_list": " ".join(archs),
        "torch_fix": torch_install_hint(ctx.acc, ctx.versions),
    }


@predicate("torch-legacy-wheels")
def _torch_legacy(ctx: Context, p: dict[str, Any]) -> Hit:
    if ctx.known or ctx.platform != "cuda" or ctx.cc is None or ctx.cc >= (7, 5):
        return None
    note = p["cu128_note"].get(str(ctx.cc[0]), "no cu128 build has it")
    return {"sm": _sm(ctx.cc), "cu128_note": note}


@predicate("torch-blackwell-wheels")
def _torch_blackwell(ctx: Context, p: dict[str, Any]) -> Hit:
    if ctx.known or ctx.platform != "cuda" or ctx.cc is None or ctx.cc < (10, 0):
        return None
    return {"sm": _sm(ctx.cc)}


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
