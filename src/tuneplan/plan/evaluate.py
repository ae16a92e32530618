"""Inside one family: the sizes that fit, and the one candidate that reaches the global batch.

Memory grows with the micro-batch (activation, logit and loss terms are non-decreasing in it) and
depends on gradient accumulation only through "more than one micro-batch per step" (then the
gradients of the earlier micro-batches live through the next forward: ``estimator/memory.py`` tests
``grad_accum > 1``). So inside a family the verdict is monotone in the micro-batch for each of the
two accumulation regimes, and the largest fitting micro-batch is one bisection
(:func:`largest_fitting_batch`, the one function a grid evaluator can replace: it answers for a whole
family at once). Every candidate returned is checked again at its exact accumulation.

Global batch rule (``G`` sequences per optimizer step, ``W`` GPUs, ``top = ceil(G / W)``):
1. micro-batch ``top`` without accumulation, if it fits (global ``top x W``: ``G`` when ``W`` divides it);
2. else the largest micro-batch ``b < top`` that fits with accumulation and, where ``W`` divides ``G``,
   divides ``G / W``; accumulation ``ceil(G / (b x W))``;
3. else (accumulation itself does not fit) the largest micro-batch that fits without it: the global
   batch is relaxed to ``b x W`` and the answer says so.
Each step is tried first with the safety margin (:mod:`tuneplan.plan.margin`), then without it; a
candidate found only without it is *tight*.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from tuneplan.api import Estimate, estimate
from tuneplan.errors import TuneplanError
from tuneplan.plan.margin import Margin, device_peak_high, fits_with_margin
from tuneplan.plan.search import largest_true
from tuneplan.plan.space import Family
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec

Verdict = Callable[[Estimate | None], bool]
GIB = 2**30
# Host memory per node when the user does not say (--host-memory): twice the node's GPU memory, at
# least 128 GiB. A DGX A100 / H100 node holds 640 GB of GPU memory and 1-2 TB of RAM; a desktop board
# takes four DIMMs, 4 x 32 GB = 128 GB. CPU offload needs its states to fit there; every answer
# prints the figure it assumed and what the offloading candidate needs.
HOST_MIN_BYTES = 128 * GIB


def default_host_bytes(gpu: Accelerator, gpus_per_node: int) -> int:
    return max(HOST_MIN_BYTES, 2 * gpu.memory_bytes * gpus_per_node)


def nominal(est: Estimate | None) -> TypeGuard[Estimate]:
    return bool(est is not None and est.fits)


class Prober:
    """Memoised memory-only ``estimate`` of one model on one card, for setups given as field dicts.

    A setup that validation refuses is None (not fitting); the user's own input is checked first with
    :meth:`check_base`, which lets its error through. :meth:`timed` adds time and cost (one call per
    candidate that is ranked).
    """

    def __init__(self, model: ModelSpec, gpu: Accelerator, base: Mapping[str, Any], *,
                 margin: Margin | None = None, timing_kw: Mapping[str, Any] | None = None,
                 host_bytes: int | None = None):
        self.model, self.gpu, self.base = model, gpu, dict(base)
        self.margin = margin
        self.host_bytes = host_bytes if host_bytes is not None else default_host_bytes(
            gpu, int(self.base.get("gpus", 1)))
        self.timing_kw = dict(timing_kw or {})
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

    def ok(self, margin: Margin | None) -> Verdict:
        """The verdict: ``Estimate.fits``, the host memory holds what is offloaded (all GPUs of the
        node), and with ``margin`` the safety margin too."""
        def v(est: Estimate | None) -> bool:
            if not nominal(est) or est.breakdown.host_bytes * est.setup.gpus > self.host_bytes:
                return False
            return margin is None or fits_with_margin(est, margin)

        return v

    def fits(self, fields: Mapping[str, Any]) -> bool:
        """With this prober's margin when it has one, else the central figure."""
        return self.ok(self.margin)(self(fields))

    def timed(self, fields: Mapping[str, Any]) -> Estimate:
        self.calls += 1
        return estimate(self.model, gpu=self.gpu, **{**self.base, **fields}, **self.timing_kw)


def largest_fitting_batch(probe: Prober, fields: Mapping[str, Any], ok: Verdict, *, grad_accum: int,
                          hi: int, known: dict[int, bool] | None = None) -> int | None:
    """Largest micro-batch in ``[1, hi]`` of a family at ``grad_accum`` that ``ok`` accepts (None: not 1)."""
    return largest_true(lambda b: ok(probe({**fields, "batch": b, "grad_accum": grad_accum})), 1, hi,
                        known=known)


@dataclass
class Candidate:
    family: Family
    batch: int
    grad_accum: int
    world: int
    target: int
    estimate: Estimate
    tight: bool  # fits only without the safety margin
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def global_batch(self) -> int:
        return self.batch * self.grad_accum * self.world

    @property
    def relaxed(self) -> bool:
        return self.global_batch < self.target

    @property
    def fields(self) -> dict[str, Any]:
        return {**self.family.as_fields, "batch": self.batch, "grad_accum": self.grad_accum}

    @property
    def device_peak_high_bytes(self) -> int:
        return device_peak_high(self.estimate)


def _compose(probe: Prober, fields: dict[str, Any], ok: Verdict, target: int, world: int,
             floor: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """(micro-batch, accumulation) by the global batch rule of the module docstring, or None.

    ``floor`` = (b, ga) at which the family is already known to pass ``ok`` (a family needing no less
    memory passed there): the search starts from it instead of from 1."""
    top = max(1, -(-target // world))

    def at(b: int, ga: int) -> bool:
        return ok(probe({**fields, "batch": b, "grad_accum": ga}))

    if floor == (top, 1) or at(top, 1):
        return top, 1
    if top == 1:
        return None
    lo = floor[0] if floor is not None and floor[1] > 1 else None
    bg = largest_true(lambda b: at(b, 2), 1, top - 1, start=lo, known={lo: True} if lo else None)
    if bg is not None:  # every b <= bg fits with accumulation (monotone); b = 1 divides anything
        exact = target % world == 0
        b = next(b for b in range(bg, 0, -1) if not exact or (target // world) % b == 0)
        return b, -(-target // (b * world))
    b1 = largest_fitting_batch(probe, fields, ok, grad_accum=1, hi=top - 1)
    return (b1, 1) if b1 is not None else None


def plan_family(probe: Prober, fam: Family, *, target: int, world: int, margin: Margin,
                timed: bool = True, floor: Candidate | None = None) -> Candidate | None:
    """The family's candidate: with the margin if possible, else tight; None if nothing fits at all.

    Its estimate is the one at its exact accumulation: the timed one when ``timed`` (one call for both
    the verdict check and the time), else a memory-only one. ``floor`` is the candidate of a family
    that needs at least as much memory (:func:`lighter_than`); its sizes are where the search starts,
    and the candidate's own estimate checks the verdict."""
    fields = fam.as_fields
    start = (floor.batch, floor.grad_accum) if floor is not None and not floor.tight else None
    for ok, tight in ((probe.ok(margin), False), (probe.ok(None), True)):
        for hint in dict.fromkeys((start, None)):
            got = _compose(probe, fields, ok, target, world, hint)
            if got is None:
                continue
            b, ga = got
            at = {**fields, "batch": b, "grad_accum": ga}
            est = probe.timed(at) if timed else probe(at)
            if ok(est):  # memory depends on accumulation only through ga > 1; checked, not assumed
                assert est is not None  # every verdict refuses None (nominal() is False for it)
                c = Candidate(fam, b, ga, world, target, est, tight)
                return measure(c) if timed else c
        start = None
    return None


def lighter_than(fam: Family) -> list[tuple[str, str, str | None, bool | None]]:
    """Keys (method, strategy, optimizer, checkpointing) of the families ``fam`` needs no more memory
    than: the same without checkpointing, or with the next heavier optimizer (paged 8-bit < 8-bit <
    32-bit AdamW). The space lists those first, so their candidates seed ``fam``'s search."""
    out: list[tuple[str, str, str | None, bool | None]] = []
    if fam.gradient_checkpointing:
        out.append((fam.method, fam.strategy, fam.optimizer, False))
    heavier = {"paged-adamw-8bit": "adamw-8bit", "adamw-8bit": None}
    if fam.optimizer in heavier:
        out.append((fam.method, fam.strategy, heavier[fam.optimizer], fam.gradient_checkpointing))
    return out


def measure(cand: Candidate) -> Candidate:
    """Time and cost of a candidate from its timed estimate: tokens/s, hours, USD per million tokens."""
    est = cand.estimate
    d = est.extras.get("sections", {})  # the time and cost sections of Estimate.to_dict(), without the rest
    t, c = d.get("time") or {}, d.get("cost") or {}
    tps = t.get("tokens_per_second")
    price = c.get("cloud_usd_per_gpu_hour")
    own = c.get("own_usd_per_gpu_hour")

    def per_m(usd_per_gpu_hour: float | None) -> float | None:  # USD per million tokens, all GPUs
        return (usd_per_gpu_hour * cand.world / tps / 3600 * 1e6
                if usd_per_gpu_hour is not None and tps else None)

    cand.metrics = {
        "tokens_per_second": tps, "step_seconds": t.get("step_seconds"), "mfu": t.get("mfu"),
        "total_hours": t.get("total_hours"), "cloud_usd": c.get("cloud_usd"), "own_usd": c.get("own_usd"),
        "break_even_hours": c.get("break_even_hours"), "cloud_usd_per_gpu_hour": price,
        "own_usd_per_gpu_hour": own, "cloud_usd_per_million_tokens": per_m(price),
        "own_usd_per_million_tokens": per_m(own),
    }
    return cand


_OPT_LIGHT = {"paged-adamw-8bit": 0, "adamw-8bit": 1}


def sparing(fams: list[Family]) -> list[Family]:
    """Per (method, strategy) the one family that needs the least memory: checkpointing on (if free to
    choose) and the lightest optimizer. Checkpointing keeps one layer's activations instead of all, and
    8-bit states (paged ones outside the device allocator) are smaller than 32-bit ones, so if no
    sparing family fits at micro-batch 1, no family of the space fits. (That is a monotonicity of
    the estimator, checked over the catalog by benchmarks/planner_consistency.py.)"""
    best: dict[tuple[str, str], Family] = {}
    for f in fams:
        k = (f.method, f.strategy)
        cur = best.get(k)
        rank = (not f.gradient_checkpointing, _OPT_LIGHT.get(f.optimizer or "", 2))
        if cur is None or rank < (not cur.gradient_checkpointing, _OPT_LIGHT.get(cur.optimizer or "", 2)):
            best[k] = f
    return list(best.values())


def first_fitting(probe: Prober, fams: list[Family],
                  compatible: Callable[[Family], bool]) -> tuple[Family, Estimate] | None:
    """The first family (offloading, sharded ones first) that fits at micro-batch 1 without accumulation."""
    order = sorted(sparing(fams), key=lambda f: ("offload-all" not in f.strategy, "offload" not in f.strategy,
                                                 f.strategy not in ("zero-3", "fsdp")))
    for f in order:
        if not compatible(f):
            continue
        est = probe({**f.as_fields, "batch": 1, "grad_accum": 1})
        if probe.ok(None)(est):
            assert est is not None  # every verdict refuses None (nominal() is False for it)
            return f, est
    return None
