"""`fit`: what runs on a card (or N cards), at which limits, with what switched on.

For each method (full, freeze, LoRA, QLoRA 8-bit, QLoRA 4-bit) the user's setup is made to fit with
the cheapest measures of :mod:`tuneplan.plan.measures`, then its limits are searched
(:mod:`tuneplan.plan.limits`). With two or more GPUs every parallel strategy (DDP, ZeRO-1/2/3, FSDP)
is also reported on its own: whether it fits, what it needs, and its largest micro-batch. One configuration is then recommended (:mod:`tuneplan.plan.recommend`).
Every number is an ``Estimate``; this module only searches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.estimator.types import GIB
from tuneplan.plan.limits import limits_at, rank_cap
from tuneplan.plan.measures import BY_KEY, DEEPSPEED_KEYS, MadeToFit, Prober, make_fit
from tuneplan.plan.search import largest_true
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec

# (label, fields): the five ways to fine-tune that hardware guides compare (size x method table + freeze).
METHOD_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("full", {"method": "full"}),
    ("freeze", {"method": "freeze"}),
    ("lora", {"method": "lora"}),
    ("qlora-8", {"method": "qlora", "bits": 8}),
    ("qlora-4", {"method": "qlora", "bits": 4}),
)
_NOT_MEASURES = frozenset(BY_KEY) - frozenset(DEEPSPEED_KEYS)
# Parallel strategies with two or more GPUs: fixed fields and the measures each may still switch on.
STRATEGIES: tuple[tuple[str, dict[str, Any], frozenset[str]], ...] = (
    ("ddp", {"zero": 0, "fsdp": False, "offload": "none"}, _NOT_MEASURES - {"offload-optimizer", "offload-all"}),
    ("zero-1", {"zero": 1, "fsdp": False}, _NOT_MEASURES - {"offload-all"}),
    ("zero-2", {"zero": 2, "fsdp": False}, _NOT_MEASURES - {"offload-all"}),
    ("zero-3", {"zero": 3, "fsdp": False}, _NOT_MEASURES),
    ("fsdp", {"zero": 0, "fsdp": True}, _NOT_MEASURES),
)


def strategy_name(setup: Any) -> str:
    """single | ddp | zero-N | fsdp, with +offload-X."""
    if setup.fsdp:
        name = "fsdp"
    elif setup.zero:
        name = f"zero-{setup.zero}"
    else:
        name = "ddp" if setup.world_size > 1 else "single"
    return name + (f"+offload-{setup.offload}" if setup.offload != "none" else "")


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
    requires_flags: list[str] = field(default_factory=list)
    device_peak_bytes: int | None = None
    headroom_bytes: int | None = None
    host_bytes: int | None = None  # CPU memory for offloaded states/params (offload rungs)
    limited_by: dict[str, str] = field(default_factory=dict)
    blocked_by: list[str] = field(default_factory=list)
    strategies: list[dict[str, Any]] = field(default_factory=list)
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
    methods: list[MethodFit]
    recommended: dict[str, Any] | None
    equal_memory: dict[str, Any] | None = None
    evaluations: int = 0

    def method(self, label: str) -> MethodFit:
        return next(m for m in self.methods if m.method == label)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "gpu": self.gpu, "world_size": self.world_size,
            "global_batch": self.global_batch,
            "methods": [m.to_dict() for m in self.methods],
            "recommended": self.recommended, "equal_memory": self.equal_memory,
            "evaluations": self.evaluations,
        }


def split_method(setup: Mapping[str, Any]) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """The method variants the user asked for (all five by default) and the rest of the setup."""
    base = {k: v for k, v in setup.items() if k not in ("method", "bits")}
    method, bits = setup.get("method"), setup.get("bits")
    if method is None:
        if bits is not None:
            return [v for v in METHOD_VARIANTS if v[1].get("bits") == bits], base
        return list(METHOD_VARIANTS), base
    chosen = [v for v in METHOD_VARIANTS if v[1]["method"] == method and (bits is None or v[1].get("bits") == bits)]
    if not chosen:
        raise TuneplanError(f"no method {method!r} with bits {bits!r}", field="method",
                            accepted="full, freeze, lora, qlora (--bits 4|8)")
    return chosen, base


def method_fit(probe: Prober, label: str, fixed: Mapping[str, Any], *, allow: frozenset[str] | None = None,
               which: tuple[str, ...] = ("batch", "seq", "rank")) -> MethodFit:
    """One method (and strategy) on the prober's card: made to fit, then its limits."""
    made: MadeToFit = make_fit(probe, fixed, allow=allow)
    est = made.estimate
    setup_d = est.setup.to_dict() if est is not None else {**probe.base, **made.fields}
    mf = MethodFit(method=label, fits=made.fits, max_batch=None, max_seq=None, max_rank=None,
                   requires=made.requires_keys, setup=setup_d, fields=made.fields,
                   requires_flags=[m.flag for m in made.requires])
    if est is not None:
        mf.strategy = strategy_name(est.setup)
        mf.device_peak_bytes = est.breakdown.device_peak_bytes
        mf.headroom_bytes = est.headroom_bytes
        mf.host_bytes = est.breakdown.host_bytes
        mf.blocked_by = [f.message for f in est.findings if f.level == "error"]
    if made.fits and est is not None:
        lim = limits_at(probe, made.fields, est.setup, which=which)
        mf.max_batch, mf.max_seq, mf.max_rank = lim.max_batch, lim.max_seq, lim.max_rank
        mf.limited_by = lim.limited_by
    return mf


def equal_memory_ranks(model: ModelSpec, gpu: Accelerator, base: Mapping[str, Any],
                       lora: MethodFit) -> dict[str, Any] | None:
    """"How much higher can QLoRA's rank go?", computed: the largest QLoRA rank within the memory LoRA uses at its rank.

    QLoRA runs at LoRA's fitting setup with only the base quantized (same checkpointing, optimizer,
    batch, sequence); the budget is LoRA's device peak, the verdict ``Estimate.fits`` on a card of
    exactly that size.
    """
    if not lora.fits or lora.device_peak_bytes is None:
        return None
    budget = lora.device_peak_bytes
    card = replace(gpu, memory_gib_usable_observed=(budget + 0.5) / GIB)
    probe = Prober(model, card, base)
    out: dict[str, Any] = {"lora_rank": lora.setup["rank"], "budget_bytes": budget, "qlora": {}}
    for bits in (8, 4):
        fields = {**lora.fields, "method": "qlora", "bits": bits,
                  "gradient_checkpointing": lora.setup["gradient_checkpointing"],
                  "optimizer": lora.setup["optimizer"]}
        est = probe(fields)
        if est is None:
            continue
        cap = rank_cap(probe, est.setup)
        best = largest_true(lambda r, f=fields: probe.fits({**f, "rank": r}), 1, cap, start=lora.setup["rank"])
        out["qlora"][f"qlora-{bits}"] = best
    out["evaluations"] = probe.calls
    return out


def fit(model: str | ModelSpec, gpu: str | Accelerator, *, global_batch: int = 16,
        **setup: Any) -> FitReport:
    """What fits on ``gpu`` (``setup['gpus']`` per node), per method, and one recommended setup."""
    from tuneplan.plan.recommend import recommend

    spec = resolve_model(model) if isinstance(model, str) else model
    acc = resolve_accelerator(gpu) if isinstance(gpu, str) else gpu
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise TuneplanError(f"must be a positive integer, got {global_batch!r}", field="global_batch",
                            accepted="1, 2, ... (sequences per optimizer step, all GPUs)")
    variants, base = split_method(setup)
    probe = Prober(spec, acc, base)
    world = probe.check_base(**variants[0][1]).setup.world_size  # also: the user's own input is valid
    methods = []
    for label, fixed in variants:
        mf = method_fit(probe, label, fixed)
        if world > 1:
            for sname, sfixed, allow in STRATEGIES:
                sf = method_fit(probe, label, {**fixed, **sfixed}, allow=allow, which=("batch",))
                mf.strategies.append({"strategy": sname, "fits": sf.fits, "requires": sf.requires,
                                      "max_batch": sf.max_batch, "device_peak_bytes": sf.device_peak_bytes,
                                      "setup_strategy": sf.strategy})
        methods.append(mf)
    rec = recommend(probe, methods, global_batch=global_batch, user_method=setup.get("method"))
    lora = next((m for m in methods if m.method == "lora"), None)
    eq = equal_memory_ranks(spec, acc, base, lora) if lora is not None else None
    return FitReport(model=spec.name, gpu=acc.to_dict(), world_size=world, global_batch=global_batch,
                     methods=methods, recommended=rec, equal_memory=eq,
                     evaluations=probe.calls + (eq or {}).get("evaluations", 0))
