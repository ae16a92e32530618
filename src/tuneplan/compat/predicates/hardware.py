"""Predicates of the card itself, the precision it runs and the attention kernels it has."""

from __future__ import annotations

from typing import Any

from tuneplan.compat.predicates.base import Hit, predicate
from tuneplan.compat.rules import (
    Context,
    rule_version,
)
from tuneplan.specs.attention_kernels import missing_kernel
from tuneplan.specs.profiles import get_profile

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
        "fp32_hint": "; on this card train in {precision=fp32}" if slow else "",
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


@predicate("attn-kernel-missing")
def _attn_kernel_missing(ctx: Context, p: dict[str, Any]) -> Hit:
    """An attention kernel transformers' class for the model does not have (specs/attention_kernels.py),
    where the framework runs transformers' model code."""
    m, attn = ctx.model, ctx.setup.attn
    if m is None or attn not in p["kernel_names"] or get_profile(ctx.setup.framework).model_code != "hf":
        return None
    why = missing_kernel(m.model_type, attn)
    if why is None:
        return None
    return {"kernel": p["kernel_names"][attn], "model_type": m.model_type, "why": why, "attn": attn,
            "alternative": p.get(f"{m.model_type}_alternative", "")}


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
