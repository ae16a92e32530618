"""The one decision rule: which candidate the planner recommends, for ``--prefer quality|speed|cost``.

Candidates are compared on one key, first field first:
1. fits with the safety margin before fits only on paper (tight);
2. reaches the target global batch before a relaxed one;
3. the objective:
   - ``quality`` (default): the most faithful method (full > LoRA > QLoRA 8-bit > QLoRA 4-bit >
     freeze: full updates every weight; LoRA approximates the update; quantizing the frozen base adds
     error, 4-bit more than 8-bit; freezing all but the last layers trains least), then the exact
     optimizer (32-bit AdamW states before block-wise 8-bit ones, arXiv 2110.02861), then tokens/s,
     then cost per token;
   - ``speed``: tokens/s, then the most faithful method, then cost per token;
   - ``cost``: cloud USD per million tokens (all GPUs), then tokens/s, then the most faithful method;
4. the order of the candidate space (a fixed order, so the answer is reproducible).
An unknown tokens/s or price ranks last on that field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.plan.evaluate import Candidate

PREFERS = ("quality", "speed", "cost")
FAITHFUL = ("full", "lora", "qlora-8", "qlora-4", "freeze")
INF = float("inf")

RULE_TEXT = {
    "quality": ("the most faithful method, then 32-bit optimizer states over 8-bit ones, then tokens/s, "
                "then cost"),
    "speed": "the most tokens/s, then the most faithful method, then cost",
    "cost": "the lowest cloud cost per token, then tokens/s, then the most faithful method",
}


def check_prefer(prefer: str) -> str:
    if prefer not in PREFERS:
        raise TuneplanError(f"unknown objective {prefer!r}", field="prefer", accepted=PREFERS)
    return prefer


def rule_text(prefer: str, margin_rule: str) -> str:
    return (f"among the candidates where {margin_rule} (else those that fit only on paper, marked tight), "
            "those that reach the target global batch (else the largest reachable), "
            f"pick {RULE_TEXT[prefer]}")


def faithful_rank(method: str) -> int:
    return FAITHFUL.index(method) if method in FAITHFUL else len(FAITHFUL)


def optimizer_rank(optimizer: str | None) -> int:
    """0 for 32-bit states (the framework's AdamW, or whatever the user set), 1 for bitsandbytes 8-bit."""
    return 1 if optimizer in ("adamw-8bit", "paged-adamw-8bit") else 0


def key(c: Candidate, prefer: str, order: int = 0) -> tuple[Any, ...]:
    tps = c.metrics.get("tokens_per_second")
    speed = -tps if tps else INF
    cost = c.metrics.get("cloud_usd_per_million_tokens")
    cost = cost if cost is not None else INF
    m = faithful_rank(c.family.method)
    o = optimizer_rank(c.family.optimizer)
    obj = {"quality": (m, o, speed, cost), "speed": (speed, m, o, cost), "cost": (cost, speed, m, o)}[prefer]
    return (c.tight, c.relaxed, *obj, order)


def known(c: Candidate, prefer: str) -> tuple[Any, ...]:
    """The fields of :func:`key` that come before the first one needing time or cost."""
    head = (c.tight, c.relaxed)
    if prefer == "quality":
        return (*head, faithful_rank(c.family.method), optimizer_rank(c.family.optimizer))
    return head


def best(cands: list[Candidate], prefer: str,
         measure: Callable[[Candidate], Any] | None = None) -> Candidate | None:
    """The candidate the rule picks (``cands`` in the space's order), or None when there is none.

    ``measure`` fills a candidate's time and cost; it is called only on the finalists, the candidates
    that tie on every field before the first that needs them (:func:`known`): the others cannot win
    whatever their time."""
    if not cands:
        return None
    if measure is not None:
        heads = [known(c, prefer) for c in cands]
        lo = min(heads)
        for c, h in zip(cands, heads, strict=True):
            if h == lo:
                measure(c)
    return min(enumerate(cands), key=lambda ic: key(ic[1], prefer, ic[0]))[1]
