"""The planner's unit of work: a prober of one model on one card, and the candidate of one family.

:class:`Prober` answers memory-only estimates of setups given as field dicts, through a
:class:`tuneplan.plan.sizes.Shared` cache (runs resolved once, card-independent parts kept across
cards). :func:`plan_family` reads a family's whole micro-batch x accumulation grid
(:mod:`tuneplan.plan.sizes`) and picks its candidate by the global batch rule; the candidate's own
scalar estimate then checks the verdict at its exact accumulation. Time and cost are computed only
for the candidates the rule has to compare on them (:func:`measure`, called by
:func:`tuneplan.plan.rule.best`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

import numpy as np

from tuneplan.api import DEFAULT_PRICES, Estimate, estimate, estimate_run
from tuneplan.estimator.runtime import run_time_and_cost
from tuneplan.plan.margin import Margin, device_peak_high, fits_with_margin
from tuneplan.plan.sizes import Shared, SizeGrid, choose, grid_width
from tuneplan.plan.space import Family
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec

Verdict = Callable[[Estimate | None], bool]
GIB = 2**30


def default_host_bytes(gpu: Accelerator, gpus_per_node: int) -> int:
    """Host memory per node when the user does not say (:func:`tuneplan.plan.host.assumed`: this
    machine's RAM for its own card, a typical cloud instance's, else the stated default). CPU offload
    needs its states to fit there; every answer prints the figure it assumed."""
    from tuneplan.plan.host import assumed

    return assumed(gpu, gpus_per_node).bytes


def nominal(est: Estimate | None) -> TypeGuard[Estimate]:
    return bool(est is not None and est.fits)


class Prober:
    """Memory-only ``estimate`` of one model on one card, for setups given as field dicts.

    A setup that validation refuses is None (not fitting); the user's own input is checked first with
    :meth:`check_base`, which lets its error through. :meth:`timed` adds time and cost (one call per
    candidate the rule compares on them). ``shared`` carries what other cards and layouts of the same
    question already computed (:class:`tuneplan.plan.sizes.Shared`); ``calls`` counts the scalar
    estimates and ``cells`` the grid configurations this prober asked for.
    """

    def __init__(self, model: ModelSpec, gpu: Accelerator, base: Mapping[str, Any], *,
                 margin: Margin | None = None, timing_kw: Mapping[str, Any] | None = None,
                 host_bytes: int | None = None, shared: Shared | None = None):
        from tuneplan.estimator.device_map import refuse_in_search

        refuse_in_search(base.get("device_map"))
        self.model, self.gpu, self.base = model, gpu, dict(base)
        self.margin = margin
        self.host_bytes = host_bytes if host_bytes is not None else default_host_bytes(
            gpu, int(self.base.get("gpus", 1)))
        self.timing_kw = dict(timing_kw or {})
        self.shared = shared if shared is not None and shared.model is model else Shared(model)
        self._memo: dict[tuple[tuple[str, Any], ...], Estimate | None] = {}
        self.calls = 0
        self._grids_seen: dict[int, SizeGrid] = {}

    @property
    def cells(self) -> int:
        """Grid configurations evaluated for this prober's questions (shared ones included)."""
        return sum(g.cells for g in self._grids_seen.values())

    @property
    def evaluations(self) -> int:
        return self.calls + self.cells

    def check_base(self, **changes: Any) -> Estimate:
        return estimate(self.model, gpu=self.gpu, timing=False, **{**self.base, **changes})

    def __call__(self, fields: Mapping[str, Any]) -> Estimate | None:
        key = tuple(sorted({**self.base, **fields}.items()))
        if key not in self._memo:
            self.calls += 1
            self._memo[key] = self.shared.memory(self.gpu, dict(key))
        return self._memo[key]

    def memory_fits(self, fields: Mapping[str, Any]) -> bool:
        """The memory side of ``ok(None)`` alone (device peak within the card, host memory), from
        figures any card of the same bf16 support shares: False rules a setup out before its
        compatibility findings on this card are computed."""
        est = self.shared.memory(self.gpu, {**self.base, **fields}, findings=False)
        return bool(est is not None and est.breakdown.device_needed_bytes <= self.gpu.memory_bytes
                    and est.breakdown.host_bytes * est.setup.gpus <= self.host_bytes)

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

    def timed(self, fields: Mapping[str, Any], memory: Estimate | None = None) -> Estimate:
        """``fields`` with time and cost. ``memory``: its memory-only estimate on this card, whose
        breakdown the time model reads (as ``api.estimate_run`` hands its own over): only the time
        and cost sections are computed."""
        self.calls += 1
        if memory is None or memory.run is None:
            run = self.shared.run(self.gpu, {**self.base, **fields})
            return estimate_run(run, gpu=self.gpu, **self.timing_kw)
        sections = run_time_and_cost(memory.run, self.gpu, self.timing_kw.get("dataset"), DEFAULT_PRICES,
                                     memory=memory.breakdown)
        return replace(memory, extras={**memory.extras, "sections": sections})

    def compat_errors(self, fam: Family) -> list[str]:
        """Why ``fam`` cannot run on this card at all; [] when it can (``Shared.errors``)."""
        return self.shared.errors(self.gpu, {**self.base, **fam.as_fields})

    def grid(self, fields: Mapping[str, Any], top: int) -> SizeGrid | None:
        """The family's micro-batch x accumulation grid (:mod:`tuneplan.plan.sizes`) for a global batch
        of ``top`` sequences per GPU: 1..``top``, or fewer past a block where nothing fits any more
        (``sizes.grid_width``)."""
        def at(width: int) -> SizeGrid | None:
            g = self.shared.grid(self.gpu, {**self.base, **fields}, width)
            if g is not None:
                self._grids_seen[id(g)] = g
            return g

        def last_passes(width: int) -> bool:
            g = at(width)
            return g is not None and bool(self.passes(g, None, 0)[-1] or self.passes(g, None, 1)[-1])

        return at(grid_width(top, last_passes))

    def passes(self, grid: SizeGrid, margin: Margin | None, row: int) -> np.ndarray:
        """:meth:`SizeGrid.passes` on this card, its host memory and GPUs per node."""
        return grid.passes(row, self.gpu.memory_bytes, self.host_bytes, int(self.base.get("gpus", 1)), margin)


@dataclass
class Candidate:
    family: Family
    batch: int
    grad_accum: int
    world: int
    target: int
    estimate: Estimate
    tight: bool  # fits only without the safety margin
    metrics: dict[str, Any] = field(default_factory=dict)  # time and cost, once measured

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


def plan_family(probe: Prober, fam: Family, *, target: int, world: int, margin: Margin) -> Candidate | None:
    """The family's candidate: with the margin if possible, else tight; None if nothing fits at all.

    Every micro-batch 1..ceil(target / world) (past 256, while the widest still fits:
    ``sizes.grid_width``), with and without accumulation, is read off one grid
    (:func:`tuneplan.plan.sizes.choose`); the candidate's memory-only scalar estimate at its exact
    accumulation checks the verdict (memory depends on accumulation only through ga > 1: checked,
    not assumed)."""
    fields = fam.as_fields
    top = max(1, -(-target // world))
    grid = probe.grid(fields, top)
    if grid is None:
        return None
    for m, tight in ((margin, False), (None, True)):
        def ok(row: int, m: Margin | None = m) -> np.ndarray:
            return probe.passes(grid, m, row)

        got = choose(ok, target, world)
        if got is None:
            continue
        b, ga = got
        est = probe({**fields, "batch": b, "grad_accum": ga})
        if probe.ok(m)(est):
            assert est is not None  # every verdict refuses None (nominal() is False for it)
            return Candidate(fam, b, ga, world, target, est, tight)
    return None


def measure(probe: Prober, cand: Candidate, margin: Margin | None = None) -> Candidate:
    """Time and cost of a candidate from its timed estimate (computed once): tokens/s, hours, USD per
    million tokens. With a safety ``margin`` (``band``, or a size / share above 0) hours and money are the
    upper end of the estimate's time band (``time.band``), as memory is judged at its upper band."""
    if cand.metrics:
        return cand
    est = cand.estimate = probe.timed(cand.fields, cand.estimate)
    d = est.extras.get("sections", {})  # the time and cost sections of Estimate.to_dict(), without the rest
    t, c = d.get("time") or {}, d.get("cost") or {}
    tps = t.get("tokens_per_second")
    band = t.get("band") or {}
    # the band's upper end over the central step: hours, money and USD per token scale by it
    safety = margin is not None and (margin.kind == "band" or margin.value > 0)
    slow = (band["step_seconds_high"] / t["step_seconds"]
            if safety and band.get("step_seconds_high") and t.get("step_seconds") else 1.0)
    price = c.get("cloud_usd_per_gpu_hour")
    own = c.get("own_usd_per_gpu_hour")

    def per_m(usd_per_gpu_hour: float | None) -> float | None:  # USD per million tokens, all GPUs
        return (usd_per_gpu_hour * cand.world / tps / 3600 * 1e6 * slow
                if usd_per_gpu_hour is not None and tps else None)

    def up(v: float | None) -> float | None:
        return None if v is None else v * slow

    cand.metrics = {
        "tokens_per_second": tps, "step_seconds": t.get("step_seconds"), "mfu": t.get("mfu"),
        "total_hours": up(t.get("total_hours")), "cloud_usd": up(c.get("cloud_usd")),
        "own_usd": up(c.get("own_usd")),
        "hours_basis": "time band upper end" if slow != 1.0 else "central estimate",
        "central_hours": t.get("total_hours"),  # what `estimate` prints for the same setup
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
        if cur is None or lightness(f) < lightness(cur):
            best[k] = f
    return list(best.values())


def lightness(f: Family) -> tuple[bool, int]:
    """Sorts a (method, strategy)'s families from the one needing least memory (:func:`sparing`)."""
    return not f.gradient_checkpointing, _OPT_LIGHT.get(f.optimizer or "", 2)


def first_fitting(probe: Prober, fams: list[Family],
                  compatible: Callable[[Family], bool]) -> tuple[Family, Estimate] | None:
    """The first family (offloading, sharded ones first) that fits at micro-batch 1 without accumulation."""
    order = sorted(sparing(fams), key=lambda f: ("offload-all" not in f.strategy, "offload" not in f.strategy,
                                                 f.strategy not in ("zero-3", "fsdp")))
    for f in order:  # memory first: it is shared across cards, the compatibility check is not
        at_one = {**f.as_fields, "batch": 1, "grad_accum": 1}
        if not probe.memory_fits(at_one):
            continue
        est = probe(at_one)
        if probe.ok(None)(est) and compatible(f):
            assert est is not None  # every verdict refuses None (nominal() is False for it)
            return f, est
    return None
