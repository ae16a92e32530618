"""The candidate set of one (model, card, layout): every family's fate, compatibility first.

1. every family of the space (:mod:`tuneplan.plan.space`) is checked for compatibility; one that
   cannot run is pruned with its reason and never costs a memory figure;
2. a (method, strategy) whose most sparing family (checkpointing on, lightest optimizer) does not fit
   at micro-batch 1 holds no candidate (checkpointing and lighter optimizer states never add memory);
3. a family the rule can never pick over one already evaluated is dominated (:func:`_dominated`);
4. every other family gets its candidate (:func:`tuneplan.plan.evaluate.plan_family`: every
   micro-batch with and without accumulation, read off one grid);
5. time and cost are computed when the rule compares on them, for the finalists only
   (:meth:`CandidateSet.best`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tuneplan.plan import rule
from tuneplan.plan.evaluate import Candidate, Prober, lightness, measure, plan_family
from tuneplan.plan.margin import Margin
from tuneplan.plan.space import Family, families


@dataclass
class CandidateSet:
    """Every family of the space with its fate: pruned (why), no fit, or its candidate."""

    families: list[Family]
    pruned: dict[Family, list[str]]
    candidates: list[Candidate]
    prefer: str
    probe: Prober
    dominated: list[Family] = field(default_factory=list)
    limits: rule.Limits = rule.NO_LIMITS
    margin: Margin | None = None  # with safety asked for, hours and cost are the time band's upper end

    def order(self, c: Candidate) -> int:
        """The candidate's place in the space's order: the rule's last tie-break."""
        return next(i for i, x in enumerate(self.candidates) if x is c)

    def of(self, method: str, strategy: str | None = None) -> list[Candidate]:
        return [c for c in self.candidates if c.family.method == method
                and (strategy is None or c.family.strategy == strategy)]

    def best(self, method: str | None = None, strategy: str | None = None,
             prefer: str | None = None) -> Candidate | None:
        """The recommendation (:func:`tuneplan.plan.rule.choose`), or one method's (one strategy's) plan
        (:func:`tuneplan.plan.rule.pick`); every candidate compared is timed first."""
        if method is None:
            return self.decide(prefer).chosen
        pool = self.of(method, strategy)
        for c in pool:
            self.measure(c)
        return rule.pick(pool, prefer or self.prefer, self.limits, self.order)

    def decide(self, prefer: str | None = None) -> rule.Choice:
        """The recommendation with what decided it (:class:`tuneplan.plan.rule.Choice`)."""
        return rule.decide(self.candidates, prefer or self.prefer, self.measure, self.limits)

    def measure(self, c: Candidate) -> Candidate:
        return measure(self.probe, c, self.margin)


def build_candidates(probe: Prober, variants: list[tuple[str, dict[str, Any]]], world: int, *, target: int,
                     margin: Margin, prefer: str, gc_first: bool | None = None,
                     every_reason: bool = True, limits: rule.Limits = rule.NO_LIMITS) -> CandidateSet:
    """The candidate set of (model, card, layout): memory, compatibility, then time when compared on it.

    A family's compatibility is checked before it can hold a candidate or decide anything about
    another (the sparing family of its (method, strategy), a dominance); the families that never get
    that far are checked at the end when ``every_reason`` (``fit`` reports why each cannot run; a
    ``gpus`` card needs only the rule's pick). The set is the same either way."""
    fams = families(variants, probe.base, world, probe.gpu, gc_first=gc_first)
    pruned: dict[Family, list[str]] = {}

    def compatible(f: Family) -> bool:
        if errs := probe.compat_errors(f):
            pruned[f] = errs
        return not errs

    dominated: list[Family] = []
    cands: list[Candidate] = []
    done: dict[tuple[str, str, str | None, bool | None], Candidate] = {}
    top = max(1, -(-target // world))
    # methods with a 32-bit-optimizer candidate without offload that keeps the margin and the target
    exact32: set[str] = set()
    dead = _dead(probe, fams, compatible)
    # 32-bit optimizer families first: under the quality rule they decide whether 8-bit ones can win
    for fam in sorted(fams, key=lambda f: rule.optimizer_rank(f.optimizer)):
        if (fam.method, fam.strategy) in dead:
            continue
        if _dominated(fam, done, top, prefer, exact32):
            dominated.append(fam)
            continue
        c = plan_family(probe, fam, target=target, world=world, margin=margin)
        if c is not None and compatible(fam):
            cands.append(c)
            done[(fam.method, fam.strategy, fam.optimizer, fam.gradient_checkpointing)] = c
            if (rule.optimizer_rank(fam.optimizer) == 0 and not c.tight and not c.relaxed
                    and fam.offload == "none" and not limits.hard):
                exact32.add(fam.method)
    if every_reason:
        for f in fams:
            compatible(f)
        dominated = [f for f in dominated if f not in pruned]  # counted once: as cannot run
    order = {f: i for i, f in enumerate(fams)}
    cands.sort(key=lambda c: order[c.family])  # the space's order: the rule's last tie-break
    return CandidateSet(fams, pruned, cands, prefer, probe, dominated, limits, margin)


def _dead(probe: Prober, fams: list[Family], compatible: Callable[[Family], bool]) -> set[tuple[str, str]]:
    """The (method, strategy) pairs whose most sparing compatible family (:func:`sparing`) does not fit
    at micro-batch 1: they hold no candidate (checkpointing and lighter optimizer states never add
    memory). Families are checked for compatibility lightest first, until one is compatible."""
    out = set()
    pairs = list(dict.fromkeys((f.method, f.strategy) for f in fams))
    for pair in pairs:
        group = [f for f in fams if (f.method, f.strategy) == pair]
        lightest = next((f for f in sorted(group, key=lightness) if compatible(f)), None)
        if lightest is None:
            continue
        at_one = {**lightest.as_fields, "batch": 1, "grad_accum": 1}
        if not probe.memory_fits(at_one) or not probe.ok(None)(probe(at_one)):
            out.add(pair)
    return out


def _dominated(fam: Family, done: dict[tuple[str, str, str | None, bool | None], Candidate], top: int,
               prefer: str, exact32: set[str]) -> bool:
    """A family the rule can never pick over one already evaluated (so it costs no estimate):
    - checkpointing on, when the same family without it already runs micro-batch ``top`` without
      accumulation and with the margin: same sizes, same method and optimizer, one more forward per step;
    - an 8-bit optimizer under the quality rule, when the method already has a 32-bit candidate without
      CPU offload that keeps the margin and reaches the target, and no hard limit can rule that one
      out (each method's plan ranks 32-bit states first among those without offload)."""
    if fam.gradient_checkpointing:
        off = done.get((fam.method, fam.strategy, fam.optimizer, False))
        if off is not None and not off.tight and (off.batch, off.grad_accum) == (top, 1):
            return True
    return prefer == "quality" and rule.optimizer_rank(fam.optimizer) == 1 and fam.method in exact32


