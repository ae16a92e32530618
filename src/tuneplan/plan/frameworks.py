"""Other frameworks for `fit`, when nothing fits with the one the setup resolves to and none was pinned.

A framework is a profile of the estimator (``specs/profiles``): its model code, checkpointing, loss
kernel and precision change the memory of the same method (Unsloth offloads the checkpointed layer
inputs to the host and fuses the loss, with no logits tensor; torchtune trains in pure bf16 and chunks
the cross-entropy). So where the default
stack fits nothing, `fit` builds each other framework's own candidate set (the same space, its
strategies: ``space.FRAMEWORK_STRATEGIES``), and the rule decides between their picks as it decides
between methods. The default stack is searched first and alone otherwise: switching stacks is a larger
change than a flag of the same stack, and the answer of a setup that fits stays that stack's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.plan import rule
from tuneplan.plan.candidates import CandidateSet, build_candidates
from tuneplan.plan.evaluate import Prober
from tuneplan.plan.margin import Margin
from tuneplan.specs.setup import FRAMEWORKS, TrainSetup


@dataclass
class Stack:
    """One framework's search: its prober, its user setup as resolved, its candidate set and choice."""

    framework: str
    probe: Prober
    baseline: TrainSetup
    cs: CandidateSet
    choice: rule.Choice


def search(probe: Prober, variants: list[tuple[str, dict[str, Any]]], framework: str, *, target: int,
           margin: Margin, prefer: str, limits: rule.Limits) -> Stack | None:
    """``framework``'s candidate set for the same question (None: the setup is not valid with it)."""
    p = Prober(probe.model, probe.gpu, {**probe.base, "framework": framework}, timing_kw=probe.timing_kw,
               host_bytes=probe.host_bytes, shared=probe.shared)
    try:
        baseline = p.check_base(**variants[0][1]).setup
    except TuneplanError:
        return None
    cs = build_candidates(p, variants, baseline.world_size, target=target, margin=margin, prefer=prefer,
                          gc_first=baseline.gradient_checkpointing, limits=limits)
    return Stack(framework, p, baseline, cs, cs.decide())


def other_stacks(first: Stack, variants: list[tuple[str, dict[str, Any]]], pinned: Mapping[str, Any], *,
                 target: int, margin: Margin, prefer: str, limits: rule.Limits) -> list[Stack]:
    """Every other framework whose candidate set holds a candidate; [] when the first stack has one or
    the user pinned the framework."""
    if first.choice.chosen is not None or "framework" in pinned:
        return []
    out = []
    for fw in FRAMEWORKS:
        if fw == first.framework:
            continue
        got = search(first.probe, variants, fw, target=target, margin=margin, prefer=prefer, limits=limits)
        if got is not None and got.choice.chosen is not None:
            out.append(got)
    return out


def decide(stacks: list[Stack], prefer: str, limits: rule.Limits) -> Stack | None:
    """The stack whose pick the rule takes among every stack's pick (``rule.decide``: per method, then
    across methods; ties go to the order of ``specs.setup.FRAMEWORKS``)."""
    picks = [s.choice.chosen for s in stacks if s.choice.chosen is not None]
    chosen = rule.decide(picks, prefer, None, limits).chosen
    return next((s for s in stacks if s.choice.chosen is chosen), None)
