"""`gpus`: rank the accelerator catalog for one fine-tune: fit, fewest cards, per-GPU memory, time, cost.

For each card the question is "the fewest cards of this kind that run the setup", where "run" means
some rung of the measures ladder fits (:func:`tuneplan.plan.measures.any_rung_fits`). From two cards
up, per-GPU memory never grows with the card count (DDP keeps a replica, ZeRO/FSDP shard by the world
size), so the smallest count is found by bisection over the counts 2..8 (one node) and then whole
8-GPU nodes; one card is checked on its own because going to two adds NCCL buffers and gradient
buckets. At the answer the ladder is walked again to report the minimal measures.

Time and cost come from ``estimate(..., dataset=DatasetSpec(...))`` when the time/cost model is
installed (``to_dict()["time"]``, ``["cost"]``); without it those columns are None.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from tuneplan.api import estimate
from tuneplan.catalog.accelerators import accelerators, resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.plan.fit import strategy_name
from tuneplan.plan.measures import Prober, any_rung_fits, as_given, make_fit
from tuneplan.plan.search import smallest_true
from tuneplan.plan.timecost import dataset_kw, time_cost
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec

GPUS_PER_NODE = 8  # the common server (DGX/HGX A100/H100: 8 GPUs); counts above go by whole nodes
DEFAULT_MAX_GPUS = 64
SORTS = ("cards", "cost", "time", "memory")


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
    host_bytes: int | None = None  # CPU memory per process for offloaded states/params (offload rungs)
    total_hours: float | None = None
    cloud_usd: float | None = None
    tokens_per_second: float | None = None
    cloud_usd_per_gpu_hr: float | None = None
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
    max_gpus: int
    ranking: list[CardResult]
    time_model: bool
    auto: bool = True
    evaluations: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "sort": self.sort, "max_gpus": self.max_gpus, "time_model": self.time_model,
                "auto": self.auto,
                "ranking": [c.to_dict() for c in self.ranking], "evaluations": self.evaluations}


def min_cards(probe: Prober, counts: list[tuple[int, dict[str, int]]],
              allow: frozenset[str] | None = None) -> int | None:
    """Index in ``counts`` of the fewest cards on which some rung fits; exact under the monotonicity above."""
    def ok(k: int) -> bool:
        return any_rung_fits(probe, counts[k][1], allow=allow)

    if not counts:
        return None
    if ok(0):
        return 0
    if len(counts) == 1 or not ok(len(counts) - 1):
        return None  # the most cards searched are not enough: no need to bisect
    return smallest_true(ok, 1, len(counts) - 1)


def _time_cost(model: ModelSpec, acc: Accelerator, fields: Mapping[str, Any], dataset: Any) -> dict[str, Any]:
    extra = dataset_kw(dataset)
    if not extra:
        return {}
    return time_cost(estimate(model, gpu=acc, **fields, **extra).to_dict())


def rate_card(model: ModelSpec, acc: Accelerator, base: Mapping[str, Any],
              counts: list[tuple[int, dict[str, int]]], dataset: Any = None,
              allow: frozenset[str] | None = None) -> tuple[CardResult, int]:
    """One card: fewest cards, the measures they need, per-GPU peak, and time/cost when known."""
    probe = Prober(model, acc, base)
    res = CardResult(gpu=acc.id, name=acc.name, memory_bytes=acc.memory_bytes, fits=False, min_gpus=None,
                     per_gpu_peak_bytes=None, cloud_usd_per_gpu_hr=acc.cloud_usd_per_gpu_hr)
    i = min_cards(probe, counts, allow)
    made = make_fit(probe, counts[i if i is not None else -1][1], allow=allow)
    est = made.estimate
    if est is not None:
        res.per_gpu_peak_bytes = est.breakdown.device_peak_bytes
        res.host_bytes = est.breakdown.host_bytes
        res.setup = est.setup.to_dict()
        res.strategy = strategy_name(est.setup)
        res.blocked_by = [f.message for f in est.findings if f.level == "error"]
    if i is not None and made.fits:
        res.fits, res.min_gpus, res.requires = True, counts[i][0], made.requires_keys
        for k, v in _time_cost(model, acc, {**base, **made.fields}, dataset).items():
            setattr(res, k, v)
    return res, probe.calls


def _sort_key(sort: str):  # noqa: ANN202 - a key function
    inf = float("inf")

    def key(c: CardResult) -> tuple:
        if not c.fits:  # the ones that do not fit last, the nearest to fitting first
            return (1, -(c.memory_bytes - (c.per_gpu_peak_bytes or 0)), c.gpu)
        cost = c.cloud_usd if c.cloud_usd is not None else inf
        hours = c.total_hours if c.total_hours is not None else inf
        by = {"cards": (c.min_gpus, cost, hours, c.memory_bytes), "cost": (cost, c.min_gpus, hours, c.memory_bytes),
              "time": (hours, c.min_gpus, cost, c.memory_bytes), "memory": (c.memory_bytes, c.min_gpus, cost, hours)}
        return (0, *by[sort], c.gpu)

    return key


def rank_gpus(model: str | ModelSpec, *, only: Iterable[str] | None = None, max_gpus: int = DEFAULT_MAX_GPUS,
              sort: str = "cards", dataset: Any = None, auto: bool = True, **setup: Any) -> GpuRanking:
    """Every catalog card (or ``only`` these) for ``model`` at ``setup``, best first.

    ``setup['gpus']`` (with ``nodes``), when given, fixes the card count instead of searching it.
    ``auto=False`` takes the setup as given (no measures switched on); the card count is still searched.
    """
    if sort not in SORTS:
        raise TuneplanError(f"unknown sort {sort!r}", field="sort", accepted=SORTS)
    if isinstance(max_gpus, bool) or not isinstance(max_gpus, int) or max_gpus < 1:
        raise TuneplanError(f"must be a positive integer, got {max_gpus!r}", field="max_gpus", accepted="1, 2, ..., 64")
    from tuneplan.specs.limits import MAX_SEARCH_GPUS

    if max_gpus > MAX_SEARCH_GPUS:  # the search walks every count: bounded before it starts
        raise TuneplanError(f"{max_gpus} cards is beyond the search", field="max_gpus",
                            accepted=f"1..{MAX_SEARCH_GPUS}")
    spec = resolve_model(model) if isinstance(model, str) else model
    cards = [resolve_accelerator(n) for n in only] if only else list(accelerators().values())
    cards = list({a.id: a for a in cards}.values())  # a card named twice is searched once
    base = {k: v for k, v in setup.items() if k not in ("gpus", "nodes")}
    if "gpus" in setup or "nodes" in setup:
        g, nd = int(setup.get("gpus", 1)), int(setup.get("nodes", 1))
        counts = [(g * nd, {"gpus": g, "nodes": nd})]
    else:
        counts = card_counts(max_gpus)
    # the user's own input must be valid (its error goes through), at the most cards searched: --zero 3
    # alone is a valid question ("how many cards with ZeRO-3"), only one card of it is not
    estimate(spec, **{**base, **counts[-1][1]})
    results, calls = [], 0
    for acc in cards:
        r, k = rate_card(spec, acc, base, counts, dataset, None if auto else as_given(base))
        results.append(r)
        calls += k
    results.sort(key=_sort_key(sort))
    return GpuRanking(model=spec.name, sort=sort, max_gpus=counts[-1][0], ranking=results,
                      time_model=dataset is not None, auto=auto, evaluations=calls)
