"""The simulate engine: the real transformers + PEFT training step on fake tensors, every storage counted.

Optional extra (``pip install 'tuneplan[simulate]'``: torch, transformers, peft, accelerate); nothing heavy
is imported until a simulation runs. ``simulate_breakdown`` returns the same ``MemoryBreakdown`` as the
analytic engine (components keyed alike), so the two compare field by field; ``simulate_report`` adds
the peak op, the live set by module, the kernel workspaces and the caching-allocator emulation.

Several GPUs: rank 0 of an FSDP job runs the real ``FullyShardedDataParallel`` (FSDP1) or ``fully_shard``
(FSDP2) on a fake process group (``simulate/distributed.py``, ``fsdp1.py``, ``fsdp2.py``, ``ddp.py``), a
ZeRO job DeepSpeed's own engine when deepspeed is installed (``simulate/zero.py``); DDP runs with its
reducer's buckets emulated. What the fake process cannot run falls back to the analytic engine with a note:
ZeRO without deepspeed, ZeRO with CPU offload, frameworks that bring their own model code or loss kernels
(Unsloth, torchtune, LitGPT), 8-bit bitsandbytes base weights, encoder models.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.estimator.types import MemoryBreakdown
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

EXTRA_HINT = "pip install 'tuneplan[simulate]'  (torch, transformers, peft, accelerate)"
# HF Trainer + transformers modeling code + PEFT; Answer.AI's fsdp_qlora train.py (simulate/fsdp_qlora.py)
SIMULATED_FRAMEWORKS = ("hf", "llamafactory", "fsdp-qlora")


class SimulateUnavailable(TuneplanError):
    """The optional extra is missing."""


class RealStackRefuses(Exception):
    """The frameworks' own code refuses the setup where the simulation runs it: a real run fails the same way
    (the message says where and why)."""


def _require_extra() -> None:
    missing = []
    for mod in ("torch", "transformers", "peft"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise SimulateUnavailable(f"the simulate engine needs {', '.join(missing)}, which is not installed",
                                  field="engine", accepted=f"{{engine=analytic}}, or {EXTRA_HINT}")


def unsupported_reason(model: ModelSpec, setup: TrainSetup) -> str:
    """Why this setup cannot be simulated in one fake process ('' when it can)."""
    if setup.zero:
        from tuneplan.simulate.zero import deepspeed_version

        if not deepspeed_version():
            return "DeepSpeed ZeRO is simulated with DeepSpeed's own engine, and deepspeed is not installed"
        if setup.offload != "none":
            from tuneplan.simulate.zero import cpu_adam_loads

            why = cpu_adam_loads()
            if why:
                return f"DeepSpeed ZeRO-Offload steps with DeepSpeed's CPU Adam: {why}"
    if setup.framework not in SIMULATED_FRAMEWORKS:
        return (f"the {setup.framework} profile runs its own model code / loss kernels, "
                "which simulate does not have")
    if setup.quant_bits == 8:
        return "8-bit (LLM.int8) base weights have no stand-in yet"
    if model.architecture not in ("decoder", "encoder"):
        return "simulate runs decoders and encoders (masked LM or classifier heads) only"
    return ""


def simulate_report(model: ModelSpec, setup: TrainSetup, *,
                    progress: Callable[[float, str], None] | None = None,
                    snapshot_path: str | None = None, capacity_bytes: int | None = None) -> Any:
    """Run the simulation (or fall back) and return a ``report.SimulationReport``."""
    from tuneplan.specs.profiles import get_profile, resolve_setup

    setup = resolve_setup(setup, model)
    if setup.device_map != "none" and setup.gpus > 1:  # per card, on a card: simulate/device_map.py
        raise TuneplanError(
            "a device_map run is placed by transformers and estimated per card of a GPU model",
            field="device_map", accepted="an estimate with {engine=simulate} and {device_map}")
    reason = unsupported_reason(model, setup)
    if reason:
        return _fallback(model, setup, reason)
    _require_extra()
    from tuneplan.simulate.engine import simulate_run
    from tuneplan.simulate.report import build_report

    try:
        run = simulate_run(model, setup, get_profile(setup.framework), progress)
    except TuneplanError:
        raise
    except RealStackRefuses as exc:
        return _fallback(model, setup, f"the real stack cannot run this setup: {exc}")
    except Exception as exc:  # the real model code refused the setup (a path with no fake kernel...)
        return _fallback(model, setup, failure_reason(exc, model, setup))
    return build_report(run, capacity=capacity_bytes, snapshot_path=snapshot_path)


# failures whose cause is known, in plain words: (text the exception carries, what it means)
KNOWN_FAILURES = (
    ("Expected inputs of BF16 type",
     "the simulation has no fp32 stand-in for torch's grouped matmul (transformers' fused MoE experts): the "
     "fake kernel accepts bf16 inputs only"),
    ("got mixed torch.Tensor and DTensor",
     "an optimizer state made as a plain tensor beside FSDP2's DTensor parameters (transformers' Adafactor: "
     "torch.zeros(shape).to(grad) for the factored moments); the real step fails the same way"),
    ("Recomputed values for the following tensors have different metadata",
     "gradient checkpointing recomputed a layer in another dtype than its forward ran in (the cause in "
     "the simulated stack is not found yet)"),
)


# compatibility rules (catalog/compat_rules.toml) whose setups fail the real stack's first step the way the
# simulation's does, with the text of that failure: when one holds and the text matches, the simulation's
# failure is that one (FSDP1 handing a 1-D sharded view to code that reads a parameter outside its unit's
# forward; FSDP refusing a layer of mixed dtypes)
REAL_STACK_RULES = (
    ("fsdp1-lora-fused-experts", "is invalid for input of size"),
    ("fsdp1-tied-embeddings-unit", "must be 2D"),
    ("fsdp1-fp32-router", "Must flatten tensors with uniform dtype"),
    ("fsdp2-fp32-router-trainable", "FSDP expects uniform original parameter dtype"),
)


def failure_reason(exc: BaseException, model: ModelSpec | None = None,
                   setup: TrainSetup | None = None) -> str:
    """Why the simulated step failed: the known causes in plain words, else the exception's first line."""
    text = str(exc)
    first = (text.strip().splitlines() or [""])[0][:300]
    for needle, meaning in KNOWN_FAILURES:
        if needle in text:
            return f"the simulated step failed: {meaning}"
    if model is not None and setup is not None:
        from tuneplan.compat import check

        failing = {code for code, needle in REAL_STACK_RULES if needle in text}
        for f in check(None, setup, model):
            if f.code in failing:
                return f"the real stack cannot run this setup ({f.code}): {f.message}"
    return f"the simulated step failed ({type(exc).__name__}: {first})"


def _fallback(model: ModelSpec, setup: TrainSetup, reason: str) -> Any:
    from tuneplan.estimator.memory import memory_breakdown
    from tuneplan.simulate.report import SimulationReport

    bd = memory_breakdown(model, setup)
    bd.notes.insert(0, f"simulate: {reason}: the figures are the analytic engine's")
    return SimulationReport(breakdown=bd, fallback=reason)


def simulate_breakdown(model: ModelSpec, setup: TrainSetup, *,
                       progress: Callable[[float, str], None] | None = None,
                       snapshot_path: str | None = None) -> MemoryBreakdown:
    """Per-GPU memory of ``setup`` from the simulated training step (engine ``"simulate"``)."""
    return simulate_report(model, setup, progress=progress, snapshot_path=snapshot_path).breakdown
