"""`gpus`: every card of the catalog for one fine-tune: fewest cards, the setup the rule picks, time, cost.

Per card:
1. the fewest cards: the smallest layout at which some family of the space fits at micro-batch 1
   (:func:`tuneplan.plan.evaluate.first_fitting`). From two cards up per-GPU memory never grows with
   the card count (DDP keeps a replica, ZeRO/FSDP shard by the world size), so the count is found by
   bisection over 2..8 (one node), then whole 8-GPU nodes; one card is checked on its own (two add
   NCCL buffers and gradient buckets);
2. at that count the same candidate set and rule as ``fit --gpus N``
   (:func:`tuneplan.plan.candidates.build_candidates`), so ``gpus`` and ``fit`` give the same answer for
   the card with the setup's own framework (where that one fits nothing, ``fit`` tries the others:
   :mod:`tuneplan.plan.frameworks`);
3. the chosen candidate's time and cost: cloud USD and owned-card USD for the run (the data size),
   per million tokens, and ``break_even_hours``: the hours of use after which buying the cards costs
   less than renting them (the estimate's cost section: card price / (cloud price - power) per GPU-hour).
Cards are ordered by the same objective (``--prefer``): those that fit first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from tuneplan.api import estimate
from tuneplan.catalog.accelerators import accelerators, resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.plan import rule
from tuneplan.plan.candidates import build_candidates
from tuneplan.plan.evaluate import Prober, first_fitting
from tuneplan.plan.fit import check_positive, host_bytes, split_method
from tuneplan.plan.margin import Margin, parse_margin
from tuneplan.plan.search import smallest_true
from tuneplan.plan.sizes import Shared
from tuneplan.plan.space import SEARCHED, Family, families, strategy_name, switches
from tuneplan.plan.timecost import dataset_kw
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.limits import MAX_SEARCH_GPUS
from tuneplan.specs.model import ModelSpec

GPUS_PER_NODE = 8  # the common server (DGX/HGX A100/H100: 8 GPUs); counts above go by whole nodes
DEFAULT_MAX_GPUS = 64
SORTS = ("prefer", "cards", "memory")


def card_counts(max_gpus: int) -> list[tuple[int, dict[str, int]]]:
    """(world size, layout) searched: 1..8 GPUs on one node, then 16, 24, ... as whole 8-GPU nodes."""
    small = [(n, {"gpus": n, "nodes": 1}) for n in range(1, min(max_gpus, GPUS_PER_NODE) + 1)]
    return small + [(n, {"gpus": GPUS_PER_NODE, "nodes": n // GPUS_PER_NODE})
                    for n in range(2 * GPUS_PER_NODE, max_gpus + 1, GPUS_PER_NODE)]


@dataclass
class CardResult:
    gpu: str
    name: str
    memory_bytes: int
    fits: bool
    min_gpus: int | None
    per_gpu_peak_bytes: int | None
    method: str | None = None
    tight: bool = False
    device_peak_high_bytes: int | None = None
    host_bytes: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    global_batch: int | None = None
    tokens_per_second: float | None = None
    total_hours: float | None = None
    cloud_usd: float | None = None
    own_usd: float | None = None
    break_even_hours: float | None = None
    cloud_usd_per_gpu_hr: float | None = None
    cloud_usd_per_million_tokens: float | None = None
    own_usd_per_million_tokens: float | None = None
    requires: list[str] = field(default_factory=list)
    strategy: str | None = None
    setup: dict[str, Any] | None = None
    blocked_by: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GpuRanking:
    model: str
    sort: str
    prefer: str
    rule: str
    max_gpus: int
    ranking: list[CardResult]
    time_model: bool
    auto: bool = True
    evaluations: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "sort": self.sort, "prefer": self.prefer, "rule": self.rule,
                "max_gpus": self.max_gpus, "time_model": self.time_model, "auto": self.auto,
                "ranking": [c.to_dict() for c in self.ranking], "evaluations": self.evaluations}


def min_cards(model: ModelSpec, acc: Accelerator, base: dict[str, Any],
              variants: list[tuple[str, dict[str, Any]]], counts: list[tuple[int, dict[str, int]]],
              calls: list[int], host: int | None = None,
              shared: Shared | None = None) -> int | None:
    """Index in ``counts`` of the fewest cards on which some family fits; exact under the monotonicity
    above."""
    def ok(k: int) -> bool:
        layout = counts[k][1]
        probe = Prober(model, acc, {**base, **layout}, host_bytes=host, shared=shared)
        fams = families(variants, probe.base, counts[k][0], acc)
        hit = first_fitting(probe, fams, lambda f: not probe.compat_errors(f))
        calls[0] += probe.evaluations
        return hit is not None

    if not counts:
        return None
    if ok(0):
        return 0
    if len(counts) == 1 or not ok(len(counts) - 1):
        return None
    return smallest_true(ok, 1, len(counts) - 1)


def least_peak(probe: Prober, fams: list[Family]) -> tuple[int | None, list[str]]:
    """(the smallest device peak of a compatible family at micro-batch 1, []), or (None, every reason)
    when no family can run. Families are taken by their memory (the same on every card of the same bf16
    support), so the first compatible one is the answer and only those before it are checked."""
    at_one = [(f, probe.shared.memory(probe.gpu, {**probe.base, **f.as_fields, "batch": 1, "grad_accum": 1},
                                      findings=False)) for f in fams]
    valid = sorted(((e.breakdown.device_peak_bytes, i) for i, (_f, e) in enumerate(at_one) if e is not None))
    for peak, i in valid:
        if not probe.compat_errors(at_one[i][0]):
            return peak, []
    errs = {m for f in fams for m in probe.compat_errors(f)}
    return None, sorted(errs) if not any(not probe.compat_errors(f) for f in fams) else []


def rate_card(model: ModelSpec, acc: Accelerator, base: dict[str, Any],
              variants: list[tuple[str, dict[str, Any]]], counts: list[tuple[int, dict[str, int]]], *,
              target: int, margin: Margin, prefer: str,
              dataset: Any = None, host: int | None = None, baseline: Any = None,
              shared: Shared | None = None) -> tuple[CardResult, int]:
    """One card: fewest cards, then the rule's candidate there, with its time and cost. ``shared`` keeps
    what does not depend on the card (resolved runs, memory, size grids) for the next card."""
    res = CardResult(gpu=acc.id, name=acc.name, memory_bytes=acc.memory_bytes, fits=False, min_gpus=None,
                     per_gpu_peak_bytes=None, cloud_usd_per_gpu_hr=acc.cloud_usd_per_gpu_hr)
    calls = [0]
    i = min_cards(model, acc, base, variants, counts, calls, host, shared)
    n, layout = counts[i if i is not None else -1]
    probe = Prober(model, acc, {**base, **layout}, timing_kw=dataset_kw(dataset), host_bytes=host,
                   shared=shared)
    if i is None:  # why not: the least memory a compatible family needs at the most cards, or compatibility
        res.per_gpu_peak_bytes, res.blocked_by = least_peak(probe, families(variants, probe.base, n, acc))
        return res, calls[0] + probe.evaluations
    baseline = baseline if baseline is not None else probe.check_base(**variants[0][1]).setup
    cs = build_candidates(probe, variants, n, target=target, margin=margin, prefer=prefer,
                          gc_first=baseline.gradient_checkpointing, every_reason=False)
    c = cs.best()
    if c is None:  # cannot happen: min_cards found a family fitting at micro-batch 1
        raise AssertionError(f"{acc.id}: fits at micro-batch 1 on {n} cards but no candidate")
    est = c.estimate
    res.fits, res.min_gpus, res.method, res.tight = True, n, c.family.method, c.tight
    res.per_gpu_peak_bytes = est.breakdown.device_peak_bytes
    res.device_peak_high_bytes = c.device_peak_high_bytes
    res.host_bytes = est.breakdown.host_bytes
    res.micro_batch, res.grad_accum, res.global_batch = c.batch, c.grad_accum, c.global_batch
    res.setup, res.strategy = est.setup.to_dict(), strategy_name(est.setup)
    res.requires = switches(est.setup, baseline)[0]
    m = c.metrics
    for k in ("tokens_per_second", "total_hours", "cloud_usd", "own_usd", "break_even_hours",
              "cloud_usd_per_million_tokens", "own_usd_per_million_tokens"):
        setattr(res, k, m.get(k))
    if m.get("cloud_usd_per_gpu_hour") is not None:
        res.cloud_usd_per_gpu_hr = m["cloud_usd_per_gpu_hour"]
    return res, calls[0] + probe.evaluations


def _sort_key(sort: str, prefer: str):  # noqa: ANN202 - a key function
    inf = float("inf")

    def key(c: CardResult) -> tuple:
        if not c.fits:  # the ones that do not fit last, the nearest to fitting first
            return (1, -(c.memory_bytes - (c.per_gpu_peak_bytes or 0)), c.gpu)
        tps = -(c.tokens_per_second or 0) or inf
        cost = c.cloud_usd_per_million_tokens if c.cloud_usd_per_million_tokens is not None else inf
        m = rule.faithful_rank(c.method or "")
        if sort == "cards":
            return (0, c.min_gpus, c.tight, m, tps, cost, c.gpu)
        if sort == "memory":
            return (0, c.memory_bytes, c.min_gpus, c.gpu)
        # balanced: each card's plan is already within the slowdown limit; the most faithful first
        obj = {"quality": (m, tps, cost), "balanced": (m, tps, cost), "speed": (tps, m, cost),
               "cost": (cost, tps, m)}[prefer]
        return (0, c.tight, *obj, c.min_gpus, c.gpu)

    return key


def rank_gpus(model: str | ModelSpec, *, only: Iterable[str] | None = None, max_gpus: int = DEFAULT_MAX_GPUS,
              sort: str = "prefer", prefer: str = rule.DEFAULT_PREFER, global_batch: int = 16,
              margin: str | Margin | None = None, dataset: Any = None, auto: bool = True,
              host_memory_gib: float | None = None, **setup: Any) -> GpuRanking:
    """Every catalog card (or ``only`` these) for ``model`` at ``setup``, best first.

    ``setup['gpus']`` (with ``nodes``), when given, fixes the card count instead of searching it.
    ``auto=False`` takes the setup as given (its strategy, optimizer and checkpointing pinned to the
    user's or the profile's values); the card count is still searched.
    """
    if sort not in SORTS:
        raise TuneplanError(f"unknown sort {sort!r}", field="sort", accepted=SORTS)
    rule.check_prefer(prefer)
    check_positive("max_gpus", max_gpus, "1, 2, ..., 64")
    if max_gpus > MAX_SEARCH_GPUS:  # the search walks every count: bounded before it starts
        raise TuneplanError(f"{max_gpus} cards is beyond the search", field="max_gpus",
                            accepted=f"1..{MAX_SEARCH_GPUS}")
    check_positive("global_batch", global_batch, "1, 2, ... (sequences per optimizer step, all GPUs)")
    mg = parse_margin(margin)
    host = host_bytes(host_memory_gib)
    spec = resolve_model(model) if isinstance(model, str) else model
    # a card named twice is searched once (``--only`` is user input: a list of thousands is one search per
    # card)
    named = {a.id: a for a in (resolve_accelerator(n) for n in dict.fromkeys(only))} if only else None
    cards = list(named.values()) if named is not None else list(accelerators().values())
    if "method" not in setup and "bits" not in setup:
        setup = {**setup, "method": "lora"}  # the ranking is for one method: the setup's (default LoRA)
    variants, base = split_method(setup)
    base = {k: v for k, v in base.items() if k not in ("gpus", "nodes", *SEARCHED)}
    if "gpus" in setup or "nodes" in setup:
        g, nd = int(setup.get("gpus", 1)), int(setup.get("nodes", 1))
        counts = [(g * nd, {"gpus": g, "nodes": nd})]
    else:
        counts = card_counts(max_gpus)
    # the user's own input must be valid (its error goes through), at the most cards searched: --zero 3
    # alone is a valid question ("how many cards with ZeRO-3"), only one card of it is not
    s = estimate(spec, timing=False, **{**base, **variants[0][1], **counts[-1][1]}).setup
    if not auto:  # as given: pin what the space would vary to the setup's resolved values
        base.update({"gradient_checkpointing": s.gradient_checkpointing, "optimizer": s.optimizer,
                     "zero": s.zero, "fsdp": s.fsdp, "offload": s.offload})
    results, calls = [], 0
    shared = Shared(spec)
    for acc in cards:
        r, k = rate_card(spec, acc, base, variants, counts, target=global_batch, margin=mg, prefer=prefer,
                         dataset=dataset, host=host, baseline=s, shared=shared)
        results.append(r)
        calls += k
    results.sort(key=_sort_key(sort, prefer))
    return GpuRanking(model=spec.name, sort=sort, prefer=prefer, rule=rule.rule_text(prefer, mg.describe()),
                      max_gpus=counts[-1][0], ranking=results, time_model=dataset is not None, auto=auto,
                      evaluations=calls)
