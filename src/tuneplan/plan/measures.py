"""What to switch on to make a setup fit: a ladder of measures, cheapest first, over the estimator.

The ladder (each rung keeps the ones before it switched on):

1. ``gradient-checkpointing``: keep only layer inputs and recompute one layer in backward; costs one
   extra forward, about +1/3 of a step's FLOPs (2N of 6N per token, DESIGN.md section 5).
2. ``adamw-8bit``: bitsandbytes blockwise 8-bit AdamW states (2 B/param instead of 8); no measurable
   slowdown (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", arXiv 2110.02861).
3. ``paged-adamw-8bit``: the same states in CUDA unified memory, paged to the host under pressure
   instead of failing; slows the step only when it pages.
4.-6. ``zero-1``, ``zero-2``, ``zero-3``: DeepSpeed ZeRO stages (arXiv 1910.02054): stages 1-2
   communicate as much as plain data parallelism, stage 3 about 1.5x (it gathers parameters).
7. ``offload-optimizer``: optimizer states, fp32 master and gradients in host memory, Adam on the CPU
   (ZeRO-Offload, arXiv 2101.06840): every step moves them over PCIe, the slowest rung but one.
8. ``offload-all``: parameters too (ZeRO-Infinity, arXiv 2104.07857): the slowest.

A rung that does not apply (already on, a stage below the user's own, or a field the user set
explicitly: ``--offload none`` pins offload off) is skipped; a combination the
setup validation refuses counts as not fitting. ZeRO and offload rungs need two or more GPUs: DeepSpeed's
single-card ZeRO-Offload is left out because the estimator treats one GPU as unsharded
(``estimator.parallel.shard`` returns before ZeRO/offload when the world size is 1), so its figure
would not describe an offloaded run. The search walks the
ladder to the first rung that fits, then drops every earlier measure that is not needed, the most
expensive first, so ``requires`` is a minimal set in ladder order. The verdict is ``Estimate.fits``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuneplan.api import Estimate, estimate
from tuneplan.errors import TuneplanError
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec


@dataclass(frozen=True)
class Measure:
    key: str
    changes: tuple[tuple[str, Any], ...]
    flag: str
    cost: str


LADDER: tuple[Measure, ...] = (
    Measure("gradient-checkpointing", (("gradient_checkpointing", True),), "--gradient-checkpointing",
            "recomputes the forward in backward: about +33% compute per step"),
    Measure("adamw-8bit", (("optimizer", "adamw-8bit"),), "--optimizer adamw-8bit",
            "8-bit optimizer states (bitsandbytes): no measurable slowdown"),
    Measure("paged-adamw-8bit", (("optimizer", "paged-adamw-8bit"),), "--optimizer paged-adamw-8bit",
            "8-bit states in unified memory: pages to the host under pressure"),
    Measure("zero-1", (("zero", 1),), "--zero 1", "shards optimizer states; same traffic as data parallel"),
    Measure("zero-2", (("zero", 2),), "--zero 2", "also shards gradients; same traffic as data parallel"),
    Measure("zero-3", (("zero", 3),), "--zero 3", "also shards parameters: about 1.5x the traffic"),
    Measure("offload-optimizer", (("offload", "optimizer"),), "--offload optimizer",
            "optimizer on the CPU: PCIe traffic and CPU Adam every step"),
    Measure("offload-all", (("offload", "all"),), "--offload all",
            "parameters on the CPU too: the slowest option"),
)
BY_KEY = {m.key: m for m in LADDER}
DEEPSPEED_KEYS = ("zero-1", "zero-2", "zero-3")
# Optimizers at least as light as each ladder optimizer: the rung is skipped when the user's is in it.
_LIGHTER = {
    "adamw-8bit": {"adamw-8bit", "paged-adamw-8bit", "adafactor", "sgd"},
    "paged-adamw-8bit": {"paged-adamw-8bit", "adafactor", "sgd"},
}
_OFFLOAD_LEVEL = {"none": 0, "optimizer": 1, "all": 2}


class Prober:
    """Memoised ``estimate`` of one model on one card for setups given as field dicts.

    The base fields are the user's; a probe that the setup validation refuses returns None (a
    combination a measure made impossible), so the user's own bad input must be checked first with
    :meth:`check_base`, which lets the error through.
    """

    def __init__(self, model: ModelSpec, gpu: Accelerator, base: Mapping[str, Any]):
        self.model, self.gpu, self.base = model, gpu, dict(base)
        self._memo: dict[tuple[tuple[str, Any], ...], Estimate | None] = {}
        self.calls = 0

    def check_base(self, **changes: Any) -> Estimate:
        return estimate(self.model, gpu=self.gpu, timing=False, **{**self.base, **changes})

    def __call__(self, fields: Mapping[str, Any]) -> Estimate | None:
        key = tuple(sorted({**self.base, **fields}.items()))
        if key not in self._memo:
            self.calls += 1
            try:
                self._memo[key] = estimate(self.model, gpu=self.gpu, timing=False, **dict(key))
            except TuneplanError:
                self._memo[key] = None
        return self._memo[key]

    def fits(self, fields: Mapping[str, Any]) -> bool:
        est = self(fields)
        return bool(est is not None and est.fits)


def applicable(fields: Mapping[str, Any], *, allow: frozenset[str] | None = None,
               pinned: frozenset[str] = frozenset()) -> list[Measure]:
    """The rungs that would change something for ``fields`` (the user's setup plus fixed choices).

    ``pinned`` names the fields the user set: a measure never overrides them (``--offload none`` means
    no offload, ``--optimizer adamw`` no 8-bit states).
    """
    out = []
    opt = fields.get("optimizer")
    multi = int(fields.get("gpus") or 1) * int(fields.get("nodes") or 1) > 1
    for m in LADDER:
        if allow is not None and m.key not in allow:
            continue
        if any(f in pinned for f, _ in m.changes):
            continue
        if m.key == "gradient-checkpointing" and fields.get("gradient_checkpointing"):
            continue
        if m.key in _LIGHTER and opt in _LIGHTER[m.key]:
            continue
        if (m.key in DEEPSPEED_KEYS or m.key.startswith("offload")) and not multi:
            continue
        if m.key in DEEPSPEED_KEYS and (fields.get("fsdp") or int(fields.get("zero") or 0) >= int(m.key[-1])):
            continue
        if m.key.startswith("offload") and _OFFLOAD_LEVEL[fields.get("offload") or "none"] >= _OFFLOAD_LEVEL[m.key[8:]]:
            continue
        out.append(m)
    return out


def as_given(base: Mapping[str, Any]) -> frozenset[str]:
    """The rungs a "setup as given" answer may climb: none. (A card without bf16 still gets fp16 when the
    precision was left to the profile: ``specs.profiles.resolve_setup`` does that, not a measure.)"""
    return frozenset()


def compose(measures: list[Measure]) -> dict[str, Any]:
    """Field changes of a set of measures; a later rung overrides an earlier one on the same field."""
    out: dict[str, Any] = {}
    for m in sorted(measures, key=LADDER.index):
        out.update(m.changes)
    return out


@dataclass
class MadeToFit:
    fits: bool
    requires: list[Measure]
    fields: dict[str, Any]  # fixed + measures: the setup the verdict is about
    estimate: Estimate | None  # at ``fields`` (the most aggressive valid rung when nothing fits)
    tried: list[Measure] = field(default_factory=list)

    @property
    def requires_keys(self) -> list[str]:
        return [m.key for m in self.requires]


def make_fit(probe: Prober, fixed: Mapping[str, Any], *, allow: frozenset[str] | None = None) -> MadeToFit:
    """Walk the ladder from ``fixed`` (on top of the prober's base) to the first rung that fits."""
    fixed = dict(fixed)
    rungs = applicable({**probe.base, **fixed}, allow=allow, pinned=frozenset(probe.base))
    est = probe(fixed)
    if est is not None and est.fits:
        return MadeToFit(True, [], fixed, est, rungs)
    last_valid, last_fields = est, fixed
    hit = None
    for i in range(len(rungs)):
        fields = {**fixed, **compose(rungs[: i + 1])}
        e = probe(fields)
        if e is not None:
            last_valid, last_fields = e, fields
            if e.fits:
                hit = i
                break
    if hit is None:
        return MadeToFit(False, [], last_fields, last_valid, rungs)
    on = rungs[: hit + 1]
    for m in reversed(rungs[:hit]):  # drop what is not needed, most expensive first
        trial = [x for x in on if x is not m]
        if probe.fits({**fixed, **compose(trial)}):
            on = trial
    fields = {**fixed, **compose(on)}
    return MadeToFit(True, on, fields, probe(fields), rungs)


def any_rung_fits(probe: Prober, fixed: Mapping[str, Any], *, allow: frozenset[str] | None = None) -> bool:
    """Whether the setup or some rung of the ladder fits (no pruning): what the size searches bisect.

    The rungs are tried from the top: near a boundary usually only the most aggressive one fits.
    """
    fixed = dict(fixed)
    rungs = applicable({**probe.base, **fixed}, allow=allow, pinned=frozenset(probe.base))
    return any(probe.fits({**fixed, **compose(rungs[:i])}) for i in range(len(rungs), -1, -1))
