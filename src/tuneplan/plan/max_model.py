"""`max-model`: the largest model a card (or N cards) can fine-tune with a method and setup.

Two answers (the practitioner's question: "how large a model without, and with, quantization or DeepSpeed"):
- the largest catalog model that fits: every catalog model is estimated (sizes are not monotone
  in anything the catalog orders by: MoE, vocabularies, tied heads), largest parameter count first;
- the largest parameter count of the standard family (:mod:`tuneplan.plan.standard_arch`) that fits,
  by exact bisection over its monotone size index, with the next size up that does not fit.
By default the setup is taken as given (profile defaults fill the rest): "with ZeRO-3" means the user
says ``--zero 3`` (a card without bf16 still gets fp16 when the precision is left to the profile:
``specs.profiles.resolve_setup`` does that). With ``auto=True`` a model fits when some family of the
same candidate space as ``fit`` fits it at micro-batch 1 (:func:`tuneplan.plan.evaluate.first_fitting`),
so ``max-model --auto`` and ``fit`` agree on every model.
``by_method`` repeats both answers for every method at the same other settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import catalog_entries, resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.plan.evaluate import Prober, first_fitting
from tuneplan.plan.fit import host_bytes, split_method
from tuneplan.plan.search import largest_true
from tuneplan.plan.space import METHOD_VARIANTS, SEARCHED, families, strategy_name, switches
from tuneplan.plan.standard_arch import MAX_INDEX, shape, standard_model
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec


@dataclass
class MaxModel:
    method: str
    largest_catalog_model: dict[str, Any] | None
    max_params: int | None
    max_shape: dict[str, int] | None = None
    next_params: int | None = None  # the next standard size up, which does not fit
    requires: list[str] = field(default_factory=list)
    catalog: list[dict[str, Any]] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)  # compatibility errors when nothing fits at all
    evaluations: int = 0

    def to_dict(self, *, with_catalog: bool = True) -> dict[str, Any]:
        d = asdict(self)
        if not with_catalog:
            d.pop("catalog")
        return d


def catalog_models() -> list[ModelSpec]:
    """Every catalog model the estimator can read (encoder-decoders are refused), largest first."""
    out: dict[str, ModelSpec] = {}
    for e in catalog_entries():
        try:
            m = resolve_model(e.hf_id, allow_network=False)
        except TuneplanError:
            continue
        out.setdefault(m.name, m)
    return sorted(out.values(), key=lambda m: (-m.params_total, m.name))


@dataclass
class Verdict:
    fits: bool
    requires: list[str]
    estimate: Any  # at the family that fits (or the setup as given); None when validation refuses it


def _verdict(model: ModelSpec, gpu: Accelerator, base: Mapping[str, Any], fixed: Mapping[str, Any],
             auto: bool, count: list[int]) -> Verdict:
    """Does ``model`` fit: as given, or (``auto``) with some family of the candidate space; the host
    memory holds what is offloaded (``base['host_memory_bytes']``, the planner's default without it)."""
    host = base.get("host_memory_bytes")
    base = {k: v for k, v in base.items() if k != "host_memory_bytes"}
    probe = Prober(model, gpu, base, host_bytes=host)
    try:
        if not auto:
            est = probe(dict(fixed))
            return Verdict(probe.ok(None)(est), [], est)
        world = int(base.get("gpus", 1)) * int(base.get("nodes", 1))
        label = next(lb for lb, f in METHOD_VARIANTS if f == dict(fixed))
        fams = families([(label, dict(fixed))], base, world, gpu)
        hit = first_fitting(probe, fams, lambda f: not probe.compat_errors(f))
        if hit is None:
            return Verdict(False, [], probe({**dict(fixed), "batch": 1}))
        baseline = probe({**dict(fixed), "batch": 1})
        names = switches(hit[1].setup, baseline.setup)[0] if baseline is not None else [strategy_name(hit[1].setup)]
        return Verdict(True, names, hit[1])
    finally:
        count[0] += probe.evaluations


def max_for_method(gpu: Accelerator, base: Mapping[str, Any], label: str, fixed: Mapping[str, Any], *,
                   auto: bool = False, models: list[ModelSpec] | None = None) -> MaxModel:
    res = MaxModel(method=label, largest_catalog_model=None, max_params=None)
    count = [0]
    for m in models if models is not None else catalog_models():
        made = _verdict(m, gpu, base, fixed, auto, count)
        est = made.estimate
        row = {"model": m.name, "params": m.params_total, "fits": made.fits,
               "device_peak_bytes": est.breakdown.device_peak_bytes if est is not None else None,
               "requires": made.requires}
        res.catalog.append(row)
        if made.fits and res.largest_catalog_model is None:
            res.largest_catalog_model = row
    best = largest_true(lambda i: _verdict(standard_model(i), gpu, base, fixed, auto, count).fits, 0, MAX_INDEX)
    if best is not None:
        res.max_params = standard_model(best).params_total
        res.max_shape = shape(best)
        res.next_params = standard_model(best + 1).params_total if best < MAX_INDEX else None
        res.requires = _verdict(standard_model(best), gpu, base, fixed, auto, count).requires
    else:  # not even the smallest size: say why when it is not memory
        made = _verdict(standard_model(0), gpu, base, fixed, auto, count)
        if made.estimate is not None:
            res.blocked_by = [f.message for f in made.estimate.findings if f.level == "error"]
    res.evaluations = count[0]
    return res


@dataclass
class MaxModelReport:
    gpu: dict[str, Any]
    world_size: int
    auto: bool
    result: MaxModel
    by_method: list[MaxModel]

    @property
    def evaluations(self) -> int:
        return sum(m.evaluations for m in self.by_method)

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "world_size": self.world_size, "auto": self.auto,
                **self.result.to_dict(),
                "by_method": [m.to_dict(with_catalog=False) for m in self.by_method]}


def max_model(gpu: str | Accelerator, *, auto: bool = False, host_memory_gib: float | None = None,
              **setup: Any) -> MaxModelReport:
    """Largest catalog model and largest standard size that fit ``gpu`` x ``setup['gpus']``."""
    acc = resolve_accelerator(gpu) if isinstance(gpu, str) else gpu
    variants, base = split_method(setup)
    base = {k: v for k, v in base.items() if k not in SEARCHED} if auto else base
    models = catalog_models()
    # the user's own input must be valid: its error goes through (probed setups swallow theirs)
    world = Prober(standard_model(0), acc, base).check_base(**variants[0][1]).setup.world_size
    host = host_bytes(host_memory_gib)
    if host is not None:
        base = {**base, "host_memory_bytes": host}
    by_method = [max_for_method(acc, base, label, fixed, auto=auto, models=models) for label, fixed in METHOD_VARIANTS]
    method = setup.get("method") or "lora"
    label = f"qlora-{setup.get('bits') or 4}" if method == "qlora" else method
    result = next(m for m in by_method if m.method == label)
    return MaxModelReport(gpu=acc.to_dict(), world_size=world, auto=auto, result=result, by_method=by_method)
