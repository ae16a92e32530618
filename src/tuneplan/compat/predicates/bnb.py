"""Predicates of bitsandbytes: its builds, the architectures its wheels cover, PEFT on top of it."""

from __future__ import annotations

from typing import Any

from tuneplan.compat.predicates.base import Hit, predicate, sm_name
from tuneplan.compat.rules import (
    BNB_OPTIMIZERS,
    Context,
    rule,
    rule_cc,
    rule_version,
)


def bnb_what(ctx: Context) -> str:
    return (
        f"{ctx.setup.quant_bits}-bit QLoRA"
        if ctx.setup.method == "qlora"
        else f"{{optimizer={ctx.setup.optimizer}}}"
    )


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
        "what": bnb_what(ctx),
        "bnb_range": label,
        "floor": f"{floor[0]}.{floor[1]}",
        "sm": sm_name(ctx.cc),
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
    return {"bnb": ctx.raw("bitsandbytes"), "what": bnb_what(ctx)}
