"""`fit`: what runs on a card (or N cards), per method, and the one setup the decision rule picks.

One candidate set is built and everything is read from it (:mod:`tuneplan.plan.space` for the space,
:mod:`tuneplan.plan.evaluate` for the sizes inside a family, :mod:`tuneplan.plan.rule` for the choice):

1. every family of the space is checked for compatibility first; a family that cannot run is pruned
   with its reason and never costs a memory figure;
2. every compatible family gets its candidate (micro-batch x accumulation reaching the global batch,
   with the safety margin if it can, read off one grid per family); the candidates the rule compares
   on time get one timed estimate each (tokens/s, cost);
3. the rule orders the candidates; the recommendation is the first, and each method's row in the
   table is the first candidate of that method, so the table, the verdict and the recommendation
   cannot disagree. A method is "cannot run" only when every one of its families was pruned.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.estimator.types import GIB
from tuneplan.plan import frameworks, rule
from tuneplan.plan.candidates import CandidateSet, build_candidates
from tuneplan.plan.evaluate import Prober, sparing
from tuneplan.plan.fit_next import fit_next_step
from tuneplan.plan.host import Machine, assumed
from tuneplan.plan.limits import limits_at
from tuneplan.plan.margin import Margin, parse_margin
from tuneplan.plan.recommend import recommendation
from tuneplan.plan.sizes import Shared
from tuneplan.plan.space import METHOD_VARIANTS, SEARCHED, strategy_name, switches
from tuneplan.plan.timecost import dataset_kw
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import FRAMEWORKS


@dataclass
class MethodFit:
    method: str
    fits: bool
    max_batch: int | None
    max_seq: int | None
    max_rank: int | None
    requires: list[str]
    setup: dict[str, Any]
    strategy: str = ""
    tight: bool = False
    requires_flags: list[str] = field(default_factory=list)
    micro_batch: int | None = None
    grad_accum: int | None = None
    global_batch: int | None = None
    device_peak_bytes: int | None = None
    device_peak_high_bytes: int | None = None
    headroom_bytes: int | None = None
    host_bytes: int | None = None  # CPU memory for offloaded states/params
    tokens_per_second: float | None = None
    total_hours: float | None = None
    cloud_usd: float | None = None
    quality_rank: int = 0  # 1 = the most faithful method (rule.FAITHFUL)
    slowdown: float | None = None  # the fastest plan's tokens/s over this one's
    over_limit: str | None = None  # the hard limit this plan breaks: "max_hours" | "budget"
    limited_by: dict[str, str] = field(default_factory=dict)
    blocked_by: list[str] = field(default_factory=list)
    strategies: list[dict[str, Any]] = field(default_factory=list)
    families: dict[str, int] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict, repr=False)  # the probe fields behind ``setup``

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("fields")
        return d


@dataclass
class FitReport:
    model: str
    gpu: dict[str, Any]
    world_size: int
    global_batch: int
    prefer: str
    margin: dict[str, Any]
    rule: str
    host_memory_bytes: int
    methods: list[MethodFit]
    recommended: dict[str, Any] | None
    candidates: list[dict[str, Any]] = field(default_factory=list)
    equal_memory: dict[str, Any] | None = None
    evaluations: int = 0
    host_memory: dict[str, Any] = field(default_factory=dict)  # host.HostMemory: the figure and its source
    limits: dict[str, Any] = field(default_factory=dict)  # rule.Limits
    next_step: dict[str, Any] | None = None  # when nothing fits: the one change that makes it fit
    # the framework of the answer: the setup's own (``default``), else another whose profile fits
    # (``plan/frameworks.py``); ``searched``: the frameworks whose candidate space was searched;
    # ``default_decided_by``: why the default one has no plan when it has none (rule.Choice.decided_by)
    framework: dict[str, Any] = field(default_factory=dict)

    @property
    def frontier(self) -> list[dict[str, Any]]:
        """The trade-off per method that fits: quality rank, time, cost, peak and its band."""
        keys = ("method", "quality_rank", "strategy", "tokens_per_second", "slowdown", "total_hours",
                "cloud_usd", "device_peak_bytes", "device_peak_high_bytes", "tight", "over_limit")
        return [{k: getattr(m, k) for k in keys} for m in sorted(self.methods, key=lambda m: m.quality_rank)
                if m.fits]

    def method(self, label: str) -> MethodFit:
        return next(m for m in self.methods if m.method == label)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "gpu": self.gpu, "world_size": self.world_size,
            "global_batch": self.global_batch, "prefer": self.prefer, "margin": self.margin,
            "rule": self.rule, "host_memory_bytes": self.host_memory_bytes, "host_memory": self.host_memory,
            "limits": self.limits,
            "methods": [m.to_dict() for m in self.methods], "frontier": self.frontier,
            "recommended": self.recommended, "next_step": self.next_step, "candidates": self.candidates,
            "equal_memory": self.equal_memory, "evaluations": self.evaluations, "framework": self.framework,
        }


def split_method(setup: Mapping[str, Any]) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """The method variants the user asked for (all five by default) and the rest of the setup."""
    base = {k: v for k, v in setup.items() if k not in ("method", "bits")}
    method, bits = setup.get("method"), setup.get("bits")
    if method is None:
        if bits is not None:
            return [v for v in METHOD_VARIANTS if v[1].get("bits") == bits], base
        return list(METHOD_VARIANTS), base
    chosen = [v for v in METHOD_VARIANTS
              if v[1]["method"] == method and (bits is None or v[1].get("bits") == bits)]
    if not chosen:
        raise TuneplanError(f"no method {method!r} with bits {bits!r}", field="method",
                            accepted="full, freeze, lora, qlora ({bits=4|8})")
    return chosen, base


def host_bytes(gib: float | None) -> int | None:
    """--host-memory (GiB per node) in bytes; None leaves the planner's default
    (evaluate.default_host_bytes)."""
    if gib is None:
        return None
    if isinstance(gib, bool) or not isinstance(gib, (int, float)) or gib <= 0:
        raise TuneplanError(f"must be a positive number of GiB, got {gib!r}", field="host_memory",
                            accepted="e.g. 64, 256, 1024 (GiB of RAM per node)")
    return int(gib * GIB)


def check_positive(name: str, v: Any, accepted: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise TuneplanError(f"must be a positive integer, got {v!r}", field=name, accepted=accepted)
    return v


def method_row(probe: Prober, cs: CandidateSet, label: str, baseline: Any, margin: Margin, *,
               limits: bool = True) -> MethodFit:
    """A method's row: its best candidate by the rule (or why it cannot run), with its limits."""
    fams = [f for f in cs.families if f.method == label]
    c = cs.best(label)
    counts = {"total": len(fams), "cannot_run": sum(f in cs.pruned for f in fams),
              "dominated": sum(f.method == label for f in cs.dominated), "fit": len(cs.of(label))}
    row = MethodFit(method=label, fits=c is not None, max_batch=None, max_seq=None, max_rank=None,
                    requires=[], setup={}, families=counts, quality_rank=rule.faithful_rank(label) + 1)
    if c is None:
        if all(f in cs.pruned for f in fams):  # cannot run whatever the space holds: say why
            row.blocked_by = sorted({m for f in fams for m in cs.pruned[f]})
        else:  # shows the most memory-sparing compatible family's figures at micro-batch 1
            live = sparing([f for f in fams if f not in cs.pruned])
            ests = [e for f in live if (e := probe({**f.as_fields, "batch": 1, "grad_accum": 1})) is not None]
            if ests:
                e = min(ests, key=lambda e: e.breakdown.device_peak_bytes)
                row.setup, row.strategy = e.setup.to_dict(), strategy_name(e.setup)
                row.device_peak_bytes, row.headroom_bytes = e.breakdown.device_peak_bytes, e.headroom_bytes
        return row
    est = c.estimate
    row.tight = c.tight
    row.setup, row.fields = est.setup.to_dict(), c.fields
    row.strategy = strategy_name(est.setup)
    row.requires, row.requires_flags = switches(est.setup, baseline)
    row.micro_batch, row.grad_accum, row.global_batch = c.batch, c.grad_accum, c.global_batch
    row.device_peak_bytes = est.breakdown.device_peak_bytes
    row.device_peak_high_bytes = c.device_peak_high_bytes
    row.headroom_bytes, row.host_bytes = est.headroom_bytes, est.breakdown.host_bytes
    row.tokens_per_second, row.total_hours = c.metrics.get("tokens_per_second"), c.metrics.get("total_hours")
    row.cloud_usd, row.over_limit = c.metrics.get("cloud_usd"), cs.limits.over(c)
    if limits:
        view = Prober(probe.model, probe.gpu, probe.base, margin=None if c.tight else margin,
                      host_bytes=probe.host_bytes, shared=probe.shared)
        view._memo = probe._memo  # same estimates, the row's own verdict
        lim = limits_at(view, c.fields, est.setup)
        row.max_batch, row.max_seq, row.max_rank = lim.max_batch, lim.max_seq, lim.max_rank
        row.limited_by = lim.limited_by
        probe.calls += view.evaluations
    names = list(dict.fromkeys(f.strategy for f in fams))
    for sname in names:
        sc = cs.best(label, sname)
        row.strategies.append({"strategy": sname, "fits": sc is not None, "tight": bool(sc and sc.tight),
                               "micro_batch": sc.batch if sc else None,
                               "grad_accum": sc.grad_accum if sc else None,
                               "requires": switches(sc.estimate.setup, baseline)[0] if sc else [],
                               "tokens_per_second": sc.metrics.get("tokens_per_second") if sc else None,
                               "device_peak_bytes": sc.estimate.breakdown.device_peak_bytes if sc else None,
                               "cannot_run": all(f in cs.pruned for f in fams if f.strategy == sname)})
    return row


# The LoRA ranks people use: powers of two from 8 to 256 (the LoRA paper's experiments use 1-64; PEFT's
# default r is 8; QLoRA's paper uses 64); a hint beyond them would name a rank no one trains with.
COMMON_RANKS = (8, 16, 32, 64, 128, 256)


def equal_memory_ranks(model: ModelSpec, gpu: Accelerator, base: Mapping[str, Any],
                       lora: MethodFit, shared: Shared | None = None) -> dict[str, Any] | None:
    """The largest common QLoRA rank (:data:`COMMON_RANKS`) within the memory LoRA uses at its rank
    (same other fields), a boundary.

    QLoRA runs at LoRA's row setup with only the base quantized; the budget is LoRA's device peak, the
    verdict ``Estimate.fits`` on a card of exactly that size; memory grows with the rank, so the ranks
    are tried from the largest down.
    """
    if not lora.fits or lora.device_peak_bytes is None:
        return None
    budget = lora.device_peak_bytes
    card = replace(gpu, memory_gib_usable_observed=(budget + 0.5) / GIB)
    probe = Prober(model, card, base, shared=shared)  # same bf16 as ``gpu``: its runs serve this card
    out: dict[str, Any] = {"lora_rank": lora.setup["rank"], "budget_bytes": budget, "qlora": {}}
    for bits in (8, 4):
        fields = {**lora.fields, "method": "qlora", "bits": bits}
        if "optimizer" not in fields:
            fields["optimizer"] = lora.setup["optimizer"]
        if probe(fields) is None:
            continue
        ranks = [r for r in COMMON_RANKS if r <= model.hidden]
        out["qlora"][f"qlora-{bits}"] = next(
            (r for r in reversed(ranks) if probe.fits({**fields, "rank": r})), None)
    out["evaluations"] = probe.evaluations
    return out


def memory_left(row: MethodFit, target: int, world: int) -> dict[str, Any] | None:
    """What the memory left under the margin buys at the plan's other settings, from its row's limits:
    a longer sequence (tokens), a larger micro-batch with fewer accumulation steps (sequences)."""
    if not row.fits or row.micro_batch is None or row.grad_accum is None:
        return None
    out: dict[str, Any] = {}
    seq = row.setup.get("seq")
    if row.max_seq is not None and seq is not None and row.max_seq > seq:
        out["seq"] = {"from": seq, "to": row.max_seq}
    if row.max_batch is not None and row.grad_accum > 1:
        per_gpu = -(-target // world)  # sequences per GPU per step
        for b in range(min(row.max_batch, per_gpu), row.micro_batch, -1):
            if per_gpu % b == 0:
                out["batch"] = {"from": row.micro_batch, "to": b, "grad_accum_from": row.grad_accum,
                                "grad_accum_to": per_gpu // b}
                break
    return out or None


def fit(model: str | ModelSpec, gpu: str | Accelerator, *, global_batch: int = 16,
        prefer: str = rule.DEFAULT_PREFER, margin: str | Margin | None = None, dataset: Any = None,
        host_memory_gib: float | None = None, max_slowdown: float | None = None,
        max_hours: float | None = None, budget: float | None = None, machine: Machine | None = None,
        detail: bool = True,
        **setup: Any) -> FitReport:
    """What fits on ``gpu`` (``setup['gpus']`` per node), per method, and the setup the rule picks.

    ``max_slowdown`` bounds ``balanced``; ``max_hours`` and ``budget`` (cloud USD) are hard limits that
    need ``dataset``. ``machine`` stands for this machine (:class:`tuneplan.plan.host.Machine`; None:
    detected) when the host memory is not given. ``detail=False`` leaves out what only the table shows
    (each row's limits, the equal-memory ranks); the candidate set, the rows' verdicts and the
    recommendation are the same."""
    spec = resolve_model(model) if isinstance(model, str) else model
    acc = resolve_accelerator(gpu) if isinstance(gpu, str) else gpu
    check_positive("global_batch", global_batch, "1, 2, ... (sequences per optimizer step, all GPUs)")
    rule.check_prefer(prefer)
    lim = rule.make_limits(max_slowdown, max_hours, budget, has_dataset=dataset is not None)
    mg = parse_margin(margin)
    variants, base = split_method(setup)
    base = {k: v for k, v in base.items() if k not in SEARCHED}
    host = assumed(acc, int(base.get("gpus", 1)), host_bytes(host_memory_gib), machine)
    probe = Prober(spec, acc, base, timing_kw=dataset_kw(dataset), host_bytes=host.bytes)
    baseline = probe.check_base(**variants[0][1]).setup  # also: the user's own input is valid
    world = baseline.world_size
    line = rule.rule_text(prefer, mg.describe(), lim)
    cs = build_candidates(probe, variants, world, target=global_batch, margin=mg, prefer=prefer,
                          gc_first=baseline.gradient_checkpointing, limits=lim)
    first = frameworks.Stack(baseline.framework, probe, baseline, cs, cs.decide())
    others = frameworks.other_stacks(first, variants, setup, target=global_batch, margin=mg, prefer=prefer,
                                     limits=lim)
    stack = frameworks.decide(others, prefer, lim) or first
    probe, baseline, cs, choice = stack.probe, stack.baseline, stack.cs, stack.choice
    methods = [method_row(probe, cs, label, baseline, mg, limits=detail) for label, _ in variants]
    for m in methods:
        c = cs.best(m.method) if m.fits else None
        m.slowdown = choice.slowdown(c) if c is not None else None
    rec = recommendation(probe, cs, baseline, mg, global_batch, world, line, choice)
    if rec is not None:
        row = next(m for m in methods if m.method == rec["method"])
        rec["memory_left"] = memory_left(row, global_batch, world) if detail else None
    lora = next((m for m in methods if m.method == "lora"), None)
    eq = (equal_memory_ranks(spec, acc, probe.base, lora, probe.shared) if lora is not None and detail
          else None)
    listed = [{"framework": st.framework, "method": c.family.method, "strategy": c.family.strategy,
               "optimizer": c.family.optimizer, "gradient_checkpointing": c.family.gradient_checkpointing,
               "micro_batch": c.batch, "grad_accum": c.grad_accum, "tight": c.tight, "relaxed": c.relaxed,
               "device_peak_bytes": c.estimate.breakdown.device_peak_bytes,
               "device_peak_high_bytes": c.device_peak_high_bytes, "over_limit": lim.over(c),
               "tokens_per_second": c.metrics.get("tokens_per_second")}
              for st in (first, *others) for c in st.cs.candidates]
    # the next step is about memory: none when a candidate exists and only a hard limit rules it out
    step = None if rec is not None or first.cs.candidates else fit_next_step(
        first.probe, variants, world, pinned_method="method" in setup or "bits" in setup)
    searched = [first.framework] + ([fw for fw in FRAMEWORKS if fw != first.framework]
                                    if first.choice.chosen is None and "framework" not in setup else [])
    return FitReport(model=spec.name, gpu=acc.to_dict(), world_size=world, global_batch=global_batch,
                     prefer=prefer, margin=mg.to_dict(), rule=line, host_memory_bytes=probe.host_bytes,
                     methods=methods, recommended=rec, candidates=listed, equal_memory=eq,
                     evaluations=sum(st.probe.evaluations for st in (first, *others))
                     + (eq or {}).get("evaluations", 0),
                     host_memory=host.to_dict(), limits=lim.to_dict(), next_step=step,
                     framework={"chosen": stack.framework, "default": first.framework,
                                "pinned": "framework" in setup, "searched": searched,
                                "default_decided_by": first.choice.decided_by})
