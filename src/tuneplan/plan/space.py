"""The planner's candidate space, and the compatibility pruning that runs before any memory figure.

A *family* fixes everything but the sizes: method x strategy (with its CPU offload) x optimizer x
gradient checkpointing. The search (:mod:`tuneplan.plan.evaluate`) then moves the sizes inside a family:
micro-batch x gradient accumulation at the user's sequence length. Per (model, card, GPUs per node, nodes):

- method: full, freeze, LoRA, QLoRA 8-bit, QLoRA 4-bit (or the one the user asked for);
- strategy: one card: plain, ZeRO-Offload (ZeRO-2 + optimizer offload, arXiv 2101.06840), ZeRO-3 with
  optimizer or full offload (ZeRO-Infinity, arXiv 2104.07857), FSDP with CPU offload; two or more
  cards: DDP, ZeRO-1/2/3, FSDP, and each with the offload it supports (ZeRO-1/2: optimizer; ZeRO-3:
  optimizer or all; FSDP: all, since FSDP's ``CPUOffload(offload_params=True)`` moves parameters,
  gradients and the optimizer step together). Only the strategies the framework runs are kept
  (:data:`FRAMEWORK_STRATEGIES`);
- optimizer: the framework's AdamW, bitsandbytes 8-bit AdamW, paged 8-bit AdamW; the bitsandbytes ones
  only where the card can run them (capability ``bnb_8bit_optim`` is not "no"), and none of them with
  CPU offload (the step runs on the CPU there: DeepSpeed's CPU Adam, torch's CPU AdamW);
- gradient checkpointing off / on.

A field the user set on the command line is pinned: the space holds only its value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tuneplan.api import build_setup
from tuneplan.compat import capabilities, check
from tuneplan.errors import TuneplanError
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import model_as_built

# (label, fields): the five ways to fine-tune.
METHOD_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("full", {"method": "full"}),
    ("freeze", {"method": "freeze"}),
    ("lora", {"method": "lora"}),
    ("qlora-8", {"method": "qlora", "bits": 8}),
    ("qlora-4", {"method": "qlora", "bits": 4}),
)
LABELS = {"full": "full fine-tuning", "freeze": "freeze-tuning (last layers only)", "lora": "LoRA",
          "qlora-8": "QLoRA 8-bit", "qlora-4": "QLoRA 4-bit"}

# name -> fields. One card: sharding needs offload to mean anything (TrainSetup.validate refuses it
# otherwise); DeepSpeed runs ZeRO-Offload on one GPU (its tutorial trains on a single V100).
SINGLE: tuple[tuple[str, dict[str, Any]], ...] = (
    ("single", {"zero": 0, "fsdp": False, "offload": "none"}),
    ("zero-2+offload-optimizer", {"zero": 2, "fsdp": False, "offload": "optimizer"}),
    ("zero-3+offload-optimizer", {"zero": 3, "fsdp": False, "offload": "optimizer"}),
    ("zero-3+offload-all", {"zero": 3, "fsdp": False, "offload": "all"}),
    ("fsdp+offload-all", {"zero": 0, "fsdp": True, "offload": "all"}),
)
MULTI: tuple[tuple[str, dict[str, Any]], ...] = (
    ("ddp", {"zero": 0, "fsdp": False, "offload": "none"}),
    ("zero-1", {"zero": 1, "fsdp": False, "offload": "none"}),
    ("zero-2", {"zero": 2, "fsdp": False, "offload": "none"}),
    ("zero-3", {"zero": 3, "fsdp": False, "offload": "none"}),
    ("fsdp", {"zero": 0, "fsdp": True, "offload": "none"}),
    ("zero-1+offload-optimizer", {"zero": 1, "fsdp": False, "offload": "optimizer"}),
    ("zero-2+offload-optimizer", {"zero": 2, "fsdp": False, "offload": "optimizer"}),
    ("zero-3+offload-optimizer", {"zero": 3, "fsdp": False, "offload": "optimizer"}),
    ("zero-3+offload-all", {"zero": 3, "fsdp": False, "offload": "all"}),
    ("fsdp+offload-all", {"zero": 0, "fsdp": True, "offload": "all"}),
)
# Which strategies each framework runs. HF Trainer / accelerate (and LLaMA-Factory on top of it, whose
# examples/deepspeed ship ds_z0..z3 with and without offload) run DeepSpeed and FSDP; torchtune's
# distributed recipes shard with FSDP2 ``fully_shard`` (``fsdp_cpu_offload``) and have no DeepSpeed;
# LitGPT's finetune scripts take FSDPStrategy for more than one device (cpu_offload off); Unsloth's
# open-source trainer runs one GPU (or plain DDP).
_ALL = frozenset(n for n, _ in SINGLE + MULTI)
FRAMEWORK_STRATEGIES: dict[str, frozenset[str]] = {
    "hf": _ALL, "llamafactory": _ALL,
    "torchtune": frozenset({"single", "fsdp", "fsdp+offload-all"}),
    "torchtune-0.2": frozenset({"single", "fsdp", "fsdp+offload-all"}),
    "litgpt": frozenset({"single", "fsdp"}),
    "unsloth": frozenset({"single", "ddp"}),
    # Answer.AI's fsdp_qlora train.py always wraps in FSDP1 (one GPU included), CPU offload or not
    "fsdp-qlora": frozenset({"single", "fsdp", "fsdp+offload-all"}),
}
BNB_OPTIMIZERS = ("adamw-8bit", "paged-adamw-8bit")
GC_CHOICES = (False, True)
STRATEGY_FIELDS = ("zero", "fsdp", "offload")
SEARCHED = ("batch", "grad_accum")  # the planner chooses these; --global-batch is the target
# fields a family sets, compared with the user's own setup to say what a candidate switches
SWITCHES = ("gradient_checkpointing", "optimizer", "zero", "fsdp", "offload")


@dataclass(frozen=True)
class Family:
    """Everything of a candidate but its sizes (micro-batch, accumulation)."""

    method: str  # label: full | freeze | lora | qlora-8 | qlora-4
    strategy: str
    optimizer: str | None  # None: the framework profile's AdamW
    gradient_checkpointing: bool | None
    fields: tuple[tuple[str, Any], ...] = field(compare=False)

    @property
    def as_fields(self) -> dict[str, Any]:
        return dict(self.fields)

    @property
    def offload(self) -> str:
        return dict(self.fields).get("offload", "none")


def strategies(world: int, framework: str, base: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The strategies of the space for this world size and framework, honouring the user's own fields."""
    table = SINGLE if world == 1 else MULTI
    allowed = FRAMEWORK_STRATEGIES.get(framework, _ALL)
    out = []
    for name, f in table:
        if name not in allowed:
            continue
        if any(k in base and base[k] != v for k, v in f.items()):
            continue  # the user pinned --zero / --fsdp / --offload to something else
        out.append((name, f))
    return out


# frameworks whose scripts take no bitsandbytes optimizer: fsdp_qlora train.py's --optimizer choices are
# adamw, adam, sgd, adadelta
NO_BNB_OPTIMIZERS = ("fsdp-qlora",)
# the method variants a framework's script runs, where it does not run them all: fsdp_qlora train.py's
# train types full / lora / qlora (bitsandbytes Linear4bit: 4-bit only)
FRAMEWORK_METHODS: dict[str, frozenset[str]] = {"fsdp-qlora": frozenset({"full", "lora", "qlora-4"})}


def optimizers(acc: Accelerator, base: Mapping[str, Any], offload: str,
               framework: str = "hf") -> list[str | None]:
    """Optimizers of the space: the user's if set; else AdamW and, where they run, the 8-bit ones."""
    if "optimizer" in base:
        return [base["optimizer"]]
    if framework in NO_BNB_OPTIMIZERS:
        return [None]
    if offload != "none":
        return [None]
    if not _bnb_optimizers_run(acc):
        return [None]  # e.g. an NPU: bitsandbytes has no backend there
    return [None, *BNB_OPTIMIZERS]


@lru_cache(maxsize=256)
def _bnb_optimizers_run(acc: Accelerator) -> bool:
    caps = {c.name: c.ok for c in capabilities(acc)}
    return caps.get("bnb_8bit_optim") is not False


def families(variants: list[tuple[str, dict[str, Any]]], base: Mapping[str, Any], world: int,
             acc: Accelerator, *, gc_first: bool | None = None) -> list[Family]:
    """The whole space of families, method by method in the order given; ``gc_first`` (the framework
    profile's checkpointing default) comes first, which decides ties the rule cannot (no tokens/s).
    The card enters only through whether bitsandbytes' optimizers run on it, so the space is kept per
    (variants, setup, world size, that, ``gc_first``): a ``gpus`` ranking asks for it per card and count."""
    try:
        key = (tuple((label, tuple(sorted(m.items()))) for label, m in variants), tuple(sorted(base.items())),
               world, _bnb_optimizers_run(acc), gc_first)
        got = _SPACES.get(key)
    except TypeError:  # a field value that cannot be a key: build it anew
        return _build_families(variants, base, world, acc, gc_first)
    if got is None:
        if len(_SPACES) >= 4096:
            _SPACES.clear()
        got = _SPACES[key] = tuple(_build_families(variants, base, world, acc, gc_first))
    return list(got)


_SPACES: dict[tuple[Any, ...], tuple[Family, ...]] = {}


def _build_families(variants: list[tuple[str, dict[str, Any]]], base: Mapping[str, Any], world: int,
                    acc: Accelerator, gc_first: bool | None) -> list[Family]:
    framework = base.get("framework", "hf")
    gcs = [base["gradient_checkpointing"]] if "gradient_checkpointing" in base else list(GC_CHOICES)
    if gc_first is not None and gc_first in gcs:
        gcs = [gc_first, *[g for g in gcs if g != gc_first]]
    out = []
    for label, mfields in variants:
        if label not in FRAMEWORK_METHODS.get(framework, frozenset({label})):
            continue
        for sname, sfields in strategies(world, framework, base):
            for opt in optimizers(acc, base, sfields["offload"], framework):
                for gc in gcs:
                    f = {**mfields, **sfields, "gradient_checkpointing": gc}
                    if opt is not None:
                        f["optimizer"] = opt
                    out.append(Family(label, sname, opt, gc, tuple(sorted(f.items()))))
    return out


def strategy_name(setup: Any) -> str:
    """single | ddp | zero-N | fsdp, with +offload-X."""
    if setup.fsdp:
        name = "fsdp"
    elif setup.zero:
        name = f"zero-{setup.zero}"
    else:
        name = "ddp" if setup.world_size > 1 else "single"
    return name + (f"+offload-{setup.offload}" if setup.offload != "none" else "")


def switches(setup: Any, baseline: Any) -> tuple[list[str], list[str]]:
    """(names, flags) of what a candidate switches on or off relative to the user's own setup."""
    names, flags = [], []
    for k in SWITCHES:
        v, b = getattr(setup, k), getattr(baseline, k)
        if v == b:
            continue
        if k == "gradient_checkpointing":
            names.append("gradient-checkpointing" if v else "no-gradient-checkpointing")
            flags.append("--gradient-checkpointing" if v else "--no-gradient-checkpointing")
        elif k == "optimizer":
            names.append(str(v))
            flags.append(f"--optimizer {v}")
        elif k == "zero":
            names.append(f"zero-{v}")
            flags.append(f"--zero {v}")
        elif k == "fsdp":
            names.append("fsdp" if v else "no-fsdp")
            flags.append("--fsdp" if v else "--no-fsdp")
        else:
            names.append(f"offload-{v}")
            flags.append(f"--offload {v}")
    return names, flags


def compat_errors(model: ModelSpec, acc: Accelerator, base: Mapping[str, Any], fam: Family) -> list[str]:
    """Why a family cannot run at all (compatibility rules, setup validation); [] when it can.

    The rules read the method, precision, optimizer, attention and strategy, never the sizes, so one
    check per family decides for all its micro-batches (catalog/compat_rules.toml).
    """
    return list(_compat_errors(model, acc, tuple(sorted({**base, **fam.as_fields}.items()))))


@lru_cache(maxsize=4096)
def _compat_errors(model: ModelSpec, acc: Accelerator, items: tuple[tuple[str, Any], ...]) -> tuple[str, ...]:
    try:
        s = build_setup(model, None, accelerator=acc, **dict(items))
    except TuneplanError as exc:
        return (str(exc),)
    built = model_as_built(model, s.framework, s.num_labels)
    return tuple(f.message for f in check(acc, s, built) if f.level == "error")
