"""The one decision rule: which candidate the planner recommends (``prefer``: balanced|quality|speed|cost).

A candidate is one family's sizes (:class:`tuneplan.plan.evaluate.Candidate`) with its time and cost.
The rule works in two steps, so that a method's row in the table and the recommendation are the same
choice:

1. **Each method's plan** (:func:`pick`, also each strategy's cell): among the method's candidates
   - those within the hard limits (``max_hours``, ``budget_usd``: need the data size), else all;
   - those that keep the safety margin, else those that fit only on paper (tight); then those that
     reach the target global batch, else the largest reachable (relaxed);
   - without CPU offload when any candidate runs without it (offload moves states over PCIe every
     step; nobody offloads what fits on the card);
   - under ``quality``, 32-bit optimizer states before 8-bit ones (block-wise quantized states,
     arXiv 2110.02861);
   - the simplest stack among those within :data:`NEAR` (10 %) of the best tokens/s (of the lowest
     cost per token under ``cost``): plain < DDP < ZeRO/FSDP < optimizer offload < full offload
     (:func:`complexity`), then 32-bit states, then tokens/s, then cost.
2. **The recommendation** (:func:`choose`): among the methods' plans within the hard limits, those
   with the best margin / global batch standing, then the objective:
   - ``balanced`` (default): the most faithful method whose tokens/s is within ``max_slowdown``
     (default 2x) of the fastest plan among the methods that adapt every layer (:data:`PARTIAL`);
   - ``quality``: the most faithful method (full > LoRA > QLoRA 8-bit > QLoRA 4-bit > freeze: full
     updates every weight; LoRA approximates the update; quantizing the frozen base adds error, 4-bit
     more than 8-bit; freezing all but the last layers trains least);
   - ``speed``: tokens/s, then the most faithful method, then cost per token;
   - ``cost``: cloud USD per million tokens (all GPUs), then tokens/s, then the most faithful method;
   then the order of the candidate space (a fixed order, so the answer is reproducible). An unknown
   tokens/s or price ranks last on that field.

The rule reads only figures the estimator computed (tokens/s, hours, USD); it computes no time itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.plan.evaluate import Candidate

PREFERS = ("balanced", "quality", "speed", "cost")
DEFAULT_PREFER = "balanced"
FAITHFUL = ("full", "lora", "qlora-8", "qlora-4", "freeze")
INF = float("inf")
# Candidates within 10 % of the best tokens/s count as equally fast: the time model's own spread on
# measured runs is of that order (benchmarks/throughput.py), so a smaller gap does not decide the stack.
NEAR = 0.10
# The default slowdown ``balanced`` accepts for a more faithful method: twice the fastest plan's time.
MAX_SLOWDOWN = 2.0
# Methods that train part of the model only: freeze-tuning updates the last layers, so its backward stops
# early and it is not the same fine-tune as one that adapts every layer; the fastest plan ``balanced``
# measures the slowdown against is taken among the others (freeze only when nothing else fits).
PARTIAL = frozenset({"freeze"})

RULE_TEXT = {
    "balanced": ("the most faithful method within {slowdown:g}x of the tokens/s of the fastest plan that "
                 "adapts every layer"),
    "quality": "the most faithful method",
    "speed": "the most tokens/s, then the most faithful method, then cost",
    "cost": "the lowest cloud cost per token, then tokens/s, then the most faithful method",
}
STACK_TEXT = ("each method's plan: no CPU offload where it fits without, then the simplest stack "
              "(plain, DDP, ZeRO/FSDP, offload) among those within 10 % of its best tokens/s")


@dataclass(frozen=True)
class Limits:
    """What the recommendation must stay within: the slowdown ``balanced`` accepts, and the hard limits
    on the run's hours and cloud USD (they need the data size)."""

    max_slowdown: float = MAX_SLOWDOWN
    max_hours: float | None = None
    budget_usd: float | None = None

    def within(self, c: Candidate) -> bool:
        """Inside the hard limits; an unknown figure is outside a limit set on it (it cannot hold)."""
        return not self.over(c)

    def over(self, c: Candidate) -> str | None:
        """The hard limit ``c`` breaks ("max_hours" or "budget"), or None."""
        h, usd = c.metrics.get("total_hours"), c.metrics.get("cloud_usd")
        if self.max_hours is not None and (h is None or h > self.max_hours):
            return "max_hours"
        if self.budget_usd is not None and (usd is None or usd > self.budget_usd):
            return "budget"
        return None

    @property
    def hard(self) -> bool:
        return self.max_hours is not None or self.budget_usd is not None

    def to_dict(self) -> dict[str, Any]:
        return {"max_slowdown": self.max_slowdown, "max_hours": self.max_hours, "budget_usd": self.budget_usd}


NO_LIMITS = Limits()


def make_limits(max_slowdown: float | None = None, max_hours: float | None = None,
                budget_usd: float | None = None, *, has_dataset: bool = False) -> Limits:
    """Checked limits: positive finite numbers; hours and budget only with a data size."""
    def positive(name: str, v: Any, accepted: str, low: float = 0.0) -> float | None:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= low:
            raise TuneplanError(f"must be a number above {low:g}, got {v!r}", field=name, accepted=accepted)
        return float(v)

    slow = positive("max_slowdown", max_slowdown, "a factor >= 1, e.g. 1.5, 2 (default), 4", 0.0)
    if slow is not None and slow < 1:
        raise TuneplanError(f"must be at least 1 (1: only the fastest plan), got {slow:g}",
                            field="max_slowdown", accepted="a factor >= 1, e.g. 1.5, 2 (default), 4")
    hours = positive("max_hours", max_hours, "hours, e.g. 12")
    usd = positive("budget", budget_usd, "USD, e.g. 50")
    for name, v in (("max_hours", hours), ("budget", usd)):
        if v is not None and not has_dataset:
            raise TuneplanError("needs the data size to bound the run", field=name,
                                accepted="give the number of samples (with their average tokens) or the "
                                         "dataset's tokens")
    return Limits(slow if slow is not None else MAX_SLOWDOWN, hours, usd)


def check_prefer(prefer: str) -> str:
    if prefer not in PREFERS:
        raise TuneplanError(f"unknown objective {prefer!r}", field="prefer", accepted=PREFERS)
    return prefer


def rule_text(prefer: str, margin_rule: str, limits: Limits = NO_LIMITS) -> str:
    hard = [f"{limits.max_hours:g} h" if limits.max_hours is not None else "",
            f"{limits.budget_usd:g} USD" if limits.budget_usd is not None else ""]
    bound = " and ".join(h for h in hard if h)
    return ((f"within {bound}, " if bound else "")
            + f"among the candidates where {margin_rule} (else those that fit only on paper, marked tight), "
            "those that reach the target global batch (else the largest reachable), "
            f"pick {RULE_TEXT[prefer].format(slowdown=limits.max_slowdown)}; {STACK_TEXT}")


def faithful_rank(method: str) -> int:
    return FAITHFUL.index(method) if method in FAITHFUL else len(FAITHFUL)


def optimizer_rank(optimizer: str | None) -> int:
    """0 for 32-bit states (the framework's AdamW, or whatever the user set), 1 for bitsandbytes 8-bit."""
    return 1 if optimizer in ("adamw-8bit", "paged-adamw-8bit") else 0


def complexity(strategy: str) -> int:
    """Moving parts of a strategy: plain 0, DDP 1, ZeRO / FSDP 2, optimizer offload 3, full offload 4."""
    if "offload-all" in strategy:
        return 4
    if "offload" in strategy:
        return 3
    if strategy.startswith(("zero", "fsdp")):
        return 2
    return 1 if strategy == "ddp" else 0


def tps_of(c: Candidate) -> float | None:
    v = c.metrics.get("tokens_per_second")
    return v if v else None


def _cost(c: Candidate) -> float:
    v = c.metrics.get("cloud_usd_per_million_tokens")
    return v if v is not None else INF


def _speed(c: Candidate) -> float:
    t = tps_of(c)
    return -t if t else INF


def _head(pool: Sequence[Candidate]) -> list[Candidate]:
    """Those with the best margin / global batch standing: keeps the margin, reaches the target."""
    lo = min((c.tight, c.relaxed) for c in pool)
    return [c for c in pool if (c.tight, c.relaxed) == lo]


def pick(cands: Sequence[Candidate], prefer: str, limits: Limits = NO_LIMITS,
         order: Callable[[Candidate], int] | None = None) -> Candidate | None:
    """One method's (or strategy's) plan: step 1 of the module docstring. ``cands`` are measured."""
    if not cands:
        return None
    if order is None:
        pos = {id(c): i for i, c in enumerate(cands)}
        order = lambda c: pos[id(c)]  # noqa: E731 - the space's order: the last tie-break
    idx = order
    pool = _untimed_pool(cands, limits)
    if prefer == "quality":
        o = min(optimizer_rank(c.family.optimizer) for c in pool)
        pool = [c for c in pool if optimizer_rank(c.family.optimizer) == o]
    if prefer == "cost" and all(_cost(c) < INF for c in pool):
        low = min(_cost(c) for c in pool)
        pool = [c for c in pool if _cost(c) <= low * (1 + NEAR)]
    elif all(tps_of(c) for c in pool):
        top = max(tps_of(c) or 0.0 for c in pool)
        pool = [c for c in pool if (tps_of(c) or 0.0) >= top * (1 - NEAR)]
    return min(pool, key=lambda c: (complexity(c.family.strategy), optimizer_rank(c.family.optimizer),
                                    _speed(c), _cost(c), idx(c)))


def _untimed_pool(cands: Sequence[Candidate], limits: Limits) -> list[Candidate]:
    """:func:`pick`'s first filters: within the hard limits, the best margin / global batch standing,
    then no CPU offload where a candidate runs without. Without a hard limit they read no time: only
    the candidates left can decide the plan, so only those need one (:func:`decide`)."""
    pool = _head([c for c in cands if limits.within(c)] or list(cands))
    return [c for c in pool if c.family.offload == "none"] or pool


@dataclass
class Choice:
    """The recommendation and why: the fastest plan and, per more faithful method, what ruled it out."""

    chosen: Candidate | None
    fastest: Candidate | None = None
    # per method more faithful than the chosen one: "no_fit" | "max_hours" | "budget" | "tight" |
    # "relaxed" | "max_slowdown", with its slowdown against the fastest plan
    passed_over: list[dict[str, Any]] | None = None
    decided_by: str = "objective"

    def slowdown(self, c: Candidate | None = None) -> float | None:
        c = c if c is not None else self.chosen
        if c is None or self.fastest is None:
            return None
        a, b = tps_of(c), tps_of(self.fastest)
        return b / a if a and b else None


def choose(picks: dict[str, Candidate], prefer: str, limits: Limits = NO_LIMITS,
           order: Callable[[Candidate], int] | None = None) -> Choice:
    """The recommendation among the methods' plans (``picks``: method -> its :func:`pick`)."""
    idx = order or (lambda c: 0)
    inside = [c for c in picks.values() if limits.within(c)]
    if not inside:
        return Choice(None, decided_by=_broken(picks.values(), limits))
    pool = _head(inside)
    whole = [c for c in pool if c.family.method not in PARTIAL] or pool
    quickest = min(whole, key=lambda c: (_speed(c), faithful_rank(c.family.method), idx(c)))
    fastest = quickest if tps_of(quickest) else None

    def faithful(c: Candidate) -> tuple[Any, ...]:
        return (faithful_rank(c.family.method), _speed(c), _cost(c), idx(c))

    if prefer == "speed":
        chosen = min(pool, key=lambda c: (_speed(c), faithful_rank(c.family.method), _cost(c), idx(c)))
    elif prefer == "cost":
        chosen = min(pool, key=lambda c: (_cost(c), _speed(c), faithful_rank(c.family.method), idx(c)))
    elif prefer == "balanced" and fastest is not None:
        top = tps_of(fastest) or 0.0
        ok = [c for c in pool if (tps_of(c) or 0.0) * limits.max_slowdown >= top]
        chosen = min(ok or [fastest], key=faithful)
    else:
        chosen = min(pool, key=faithful)
    out = Choice(chosen, fastest)
    out.passed_over = [_why_not(m, picks.get(m), chosen, prefer, limits, out)
                       for m in FAITHFUL[:faithful_rank(chosen.family.method)]]
    # what decided: why the nearest more faithful method that could run was passed over
    fitting = [p for p in out.passed_over if p["why"] != "no_fit"]
    out.decided_by = (fitting[-1]["why"] if fitting else "no_fit" if out.passed_over else
                      "quality" if prefer in ("balanced", "quality") else "objective")
    return out


def _why_not(method: str, c: Candidate | None, chosen: Candidate, prefer: str, limits: Limits,
             choice: Choice) -> dict[str, Any]:
    """Why a method more faithful than the chosen one was passed over, with its figures."""
    if c is None:
        return {"method": method, "why": "no_fit", "slowdown": None, "total_hours": None, "cloud_usd": None}
    why = (limits.over(c) or ("tight" if c.tight and not chosen.tight else None)
           or ("relaxed" if c.relaxed and not chosen.relaxed else None)
           or ("max_slowdown" if prefer == "balanced" else "objective"))
    return {"method": method, "why": why, "slowdown": choice.slowdown(c),
            "total_hours": c.metrics.get("total_hours"), "cloud_usd": c.metrics.get("cloud_usd")}


def _broken(cands: Any, limits: Limits) -> str:
    """Which hard limit left nothing: "max_hours" when any plan breaks it, else "budget"."""
    broken = {limits.over(c) for c in cands}
    return "max_hours" if "max_hours" in broken else "budget" if "budget" in broken else "no_fit"


def best(cands: list[Candidate], prefer: str, measure: Callable[[Candidate], Any] | None = None,
         limits: Limits = NO_LIMITS) -> Candidate | None:
    """The recommendation over ``cands`` (in the space's order): every method's :func:`pick`, then
    :func:`choose`. ``measure`` fills a candidate's time and cost first."""
    return decide(cands, prefer, measure, limits).chosen


def decide(cands: list[Candidate], prefer: str, measure: Callable[[Candidate], Any] | None = None,
           limits: Limits = NO_LIMITS) -> Choice:
    """:func:`best` with what decided it. ``measure`` times the candidates the rule reads: every one
    under a hard limit (it reads their hours and cost), else those :func:`_untimed_pool` leaves of each
    method (the others cannot be its plan, so no figure of theirs enters the choice)."""
    if measure is not None:
        for m in dict.fromkeys(c.family.method for c in cands):
            group = [c for c in cands if c.family.method == m]
            for c in group if limits.hard else _untimed_pool(group, limits):
                measure(c)
    pos = {id(c): i for i, c in enumerate(cands)}

    def idx(c: Candidate) -> int:
        return pos[id(c)]

    picks: dict[str, Candidate] = {}
    for m in dict.fromkeys(c.family.method for c in cands):
        got = pick([c for c in cands if c.family.method == m], prefer, limits, idx)
        if got is not None:
            picks[m] = got
    return choose(picks, prefer, limits, idx)
