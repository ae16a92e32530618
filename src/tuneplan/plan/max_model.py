"""`max-model`: the largest model a card (or N cards) can fine-tune with a method and setup.

Two answers (the practitioner's question: "how large a model without, and with, quantization or DeepSpeed"):
- the largest catalog model that fits: every catalog model is estimated (sizes are not monotone
  in anything the catalog orders by: MoE, vocabularies, tied heads), largest parameter count first;
- the largest parameter count of the standard family (:mod:`tuneplan.plan.standard_arch`) that fits,
  by exact bisection over its monotone size index, with the next size up that does not fit.
By default the setup is taken as given (profile defaults fill the rest): "with ZeRO-3" means the user
says ``--zero 3`` (a card without bf16 still gets fp16 when the precision is left to the profile:
``specs.profiles.resolve_setup`` does that). With ``auto=True`` a model fits when some family of the
same candidate space as ``fit`` fits it at micro-batch 1 and trains at a usable speed
(:data:`USABLE_TOKENS_PER_S`, the host memory bounding what is offloaded), with its hours shown.
``by_method`` repeats both answers for every method at the same other settings. A model whose weights
cannot be held by the cards and the host memory together (:func:`beyond_memory`), or a family that keeps
them on the cards when they exceed those (:func:`on_cards_beyond_memory`), is ruled out unprobed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import catalog_entries, resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.plan.evaluate import Prober, default_host_bytes, sparing
from tuneplan.plan.fit import host_bytes, split_method
from tuneplan.plan.search import largest_true, largest_true_near
from tuneplan.plan.sizes import Shared
from tuneplan.plan.space import METHOD_VARIANTS, SEARCHED, Family, families, strategy_name, switches
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
    return list(_catalog_models())


@lru_cache(maxsize=1)
def _catalog_models() -> tuple[ModelSpec, ...]:
    """Read once, as ``catalog_entries`` reads the catalog's index once: the package's own files."""
    out: dict[str, ModelSpec] = {}
    for e in catalog_entries():
        try:
            m = resolve_model(e.hf_id, allow_network=False)
        except TuneplanError:
            continue
        out.setdefault(m.name, m)
    return tuple(sorted(out.values(), key=lambda m: (-m.params_total, m.name)))


@dataclass
class Verdict:
    fits: bool
    requires: list[str]
    estimate: Any  # at the family that fits (or the setup as given); None when validation refuses it
    tokens_per_second: float | None = None  # with --auto: the fastest family at micro-batch 1
    hours: float | None = None  # ... at the reference data size (REFERENCE_SAMPLES x REFERENCE_TOKENS)


# ``--auto`` counts a model only where it trains at a usable speed: a small instruction set, 10,000
# samples of 512 tokens (5.12 M tokens, the web page's default data size), in one day on these cards:
# 5.12e6 / 86,400 s = 59 tokens/s. A plan slower than that (a 235B model streamed from host memory
# through PCIe every step) fits on paper but is not an answer to "what can I train here".
REFERENCE_SAMPLES, REFERENCE_TOKENS = 10_000, 512
USABLE_HOURS = 24.0
USABLE_TOKENS_PER_S = REFERENCE_SAMPLES * REFERENCE_TOKENS / (USABLE_HOURS * 3600)


def _verdict(model: ModelSpec, gpu: Accelerator, base: Mapping[str, Any], fixed: Mapping[str, Any],
             auto: bool, count: list[int], *, whole: bool = True, shared: Shared | None = None) -> Verdict:
    """Does ``model`` fit: as given, or (``auto``) with some family of the candidate space at a usable
    speed (the fastest family that fits at micro-batch 1 reaches :data:`USABLE_TOKENS_PER_S`); the host
    memory holds what is offloaded (``base['host_memory_bytes']``, the planner's default without it).
    ``whole=False`` answers ``fits`` alone: the search stops at the first family fast enough (the
    fastest reaches the speed exactly when some family does), and the rest of the verdict is left out.
    ``shared``: what an earlier verdict on the same model object resolved (``sizes.Shared``)."""
    host = base.get("host_memory_bytes")
    base = {k: v for k, v in base.items() if k != "host_memory_bytes"}
    probe = Prober(model, gpu, base, host_bytes=host, timing_kw={"dataset": _reference()}, shared=shared)
    try:
        if beyond_memory(model, fixed, gpu, base, probe.host_bytes) and (auto or not whole):
            # no setup holds its weights: the verdict a search where no family fits gives, unprobed
            return Verdict(False, [], probe({**dict(fixed), "batch": 1}) if whole else None)
        if not auto:
            est = probe(dict(fixed))
            return Verdict(probe.ok(None)(est), [], est)
        world = int(base.get("gpus", 1)) * int(base.get("nodes", 1))
        label = next(lb for lb, f in METHOD_VARIANTS if f == dict(fixed))
        fams = families([(label, dict(fixed))], base, world, gpu)
        hit = fastest_fitting(probe, fams, lambda f: not probe.compat_errors(f),
                              enough=None if whole else USABLE_TOKENS_PER_S)
        if hit is None:
            return Verdict(False, [], probe({**dict(fixed), "batch": 1}) if whole else None)
        tps, hours = hit[2]
        if not whole:
            return Verdict(tps >= USABLE_TOKENS_PER_S, [], None)
        try:  # the setup as given, resolved (its memory is not needed: only what the family switches)
            names = switches(hit[1].setup, probe.shared.setup(gpu, {**base, **dict(fixed)}))[0]
        except TuneplanError:
            names = [strategy_name(hit[1].setup)]
        return Verdict(tps >= USABLE_TOKENS_PER_S, names, hit[1], tps, hours)
    finally:
        count[0] += probe.evaluations


def weights_floor(model: ModelSpec, fixed: Mapping[str, Any]) -> float:
    """Bytes the model's weights take at the least, whatever the strategy: every parameter but the
    lm_head (a classification model replaces it, ``specs.profiles.model_as_built``) stored in 16 bits, or
    under QLoRA in ``bits`` (bitsandbytes packs two 4-bit codes per byte in ``Params4bit``, one 8-bit code
    per byte in ``Int8Params``; the layers it leaves alone stay 16-bit, so this is below the storage)."""
    per_param = int(fixed.get("bits") or 4) / 8 if fixed.get("method") == "qlora" else 2.0
    return (model.params_total - model.lm_head_params) * per_param


def beyond_memory(model: ModelSpec, fixed: Mapping[str, Any], gpu: Accelerator, base: Mapping[str, Any],
                  host_limit: int) -> bool:
    """True when the weights cannot be held by all the cards and their nodes' host memory together: a
    setup fits only with every GPU's device figure within the card and its host share within the
    node's host memory over its GPUs, and the weights live on a GPU or on the host (sharded or not),
    so ``weights_floor`` <= GPUs x card memory + nodes x host memory for anything that fits. Cheaper
    than resolving a run: the catalog's largest models are ruled out without one."""
    gpus, nodes = int(base.get("gpus", 1)), int(base.get("nodes", 1))
    return weights_floor(model, fixed) > gpus * nodes * gpu.memory_bytes + nodes * host_limit


def on_cards_beyond_memory(probe: Prober, fields: Mapping[str, Any]) -> bool:
    """True when ``fields`` keep the weights on the GPUs (``offload`` said outright: none, or the optimizer
    states alone, DeepSpeed's ``offload_optimizer``) and the weights exceed the cards' memory: every weight
    then lives on a GPU, sharded at most over all of them, so a fitting setup has ``weights_floor`` <=
    GPUs x card memory. Rules a family out before its run is resolved."""
    if fields.get("offload") not in ("none", "optimizer"):
        return False
    gpus, nodes = int(probe.base.get("gpus", 1)), int(probe.base.get("nodes", 1))
    return weights_floor(probe.model, fields) > gpus * nodes * probe.gpu.memory_bytes


def _reference() -> Any:
    from tuneplan.plan.timecost import make_dataset

    return make_dataset(samples=REFERENCE_SAMPLES, avg_tokens=float(REFERENCE_TOKENS))


def fastest_fitting(probe: Prober, fams: list[Family], compatible: Callable[[Family], bool], *,
                    enough: float | None = None) -> tuple[Family, Any, tuple[float, float | None]] | None:
    """Among the most sparing family of each (method, strategy) (:func:`tuneplan.plan.evaluate.sparing`)
    that fits at micro-batch 1 and can run: the fastest, with its (tokens/s, hours at the reference
    data size), from the time model; with ``enough`` tokens/s, the first family that reaches it when
    one does."""
    best: tuple[Family, Any, tuple[float, float | None]] | None = None
    for f in sparing(fams):
        at_one = {**f.as_fields, "batch": 1, "grad_accum": 1}
        if on_cards_beyond_memory(probe, at_one) or not probe.memory_fits(at_one):
            continue
        est = probe(at_one)
        if not probe.ok(None)(est) or not compatible(f):
            continue
        t = (probe.timed(at_one, est).extras.get("sections") or {}).get("time") or {}
        speed = (float(t.get("tokens_per_second") or 0.0), t.get("total_hours"))
        if best is None or speed[0] > best[2][0]:
            best = (f, est, speed)
        if enough is not None and speed[0] >= enough:
            break
    return best


def max_for_method(gpu: Accelerator, base: Mapping[str, Any], label: str, fixed: Mapping[str, Any], *,
                   auto: bool = False, models: list[ModelSpec] | None = None,
                   whole_catalog: bool = True) -> MaxModel:
    """Both answers for one method. ``whole_catalog=False`` keeps only the answer: the catalog scan
    stops at the first model that fits (largest first), and ``catalog`` holds its row alone (every
    model's row is shown only for the method asked for, :func:`max_model`). The bisection's probes
    need only ``fits`` and start from the size of the largest catalog model that fits; the answer's
    full verdict is computed once."""
    res = MaxModel(method=label, largest_catalog_model=None, max_params=None)
    count = [0]
    for m in models if models is not None else catalog_models():
        shared = Shared(m)
        quick = (None if whole_catalog
                 else _verdict(m, gpu, base, fixed, auto, count, whole=False, shared=shared))
        if quick is not None and not quick.fits:
            continue
        made = _verdict(m, gpu, base, fixed, auto, count, shared=shared)
        est = made.estimate
        row = {"model": m.name, "params": m.params_total, "fits": made.fits,
               "device_peak_bytes": est.breakdown.device_peak_bytes if est is not None else None,
               "requires": made.requires, "tokens_per_second": made.tokens_per_second, "hours": made.hours,
               "too_slow": made.tokens_per_second is not None and not made.fits}
        res.catalog.append(row)
        if made.fits and res.largest_catalog_model is None:
            res.largest_catalog_model = row
            if not whole_catalog:
                break
    sizes: dict[int, Shared] = {}  # per size index probed: its model and what its verdicts resolved

    def at(i: int) -> Shared:
        return sizes.setdefault(i, Shared(standard_model(i)))

    def fits_at(i: int) -> bool:
        return _verdict(at(i).model, gpu, base, fixed, auto, count, whole=False, shared=at(i)).fits

    near = res.largest_catalog_model
    best = (largest_true(fits_at, 0, MAX_INDEX) if near is None
            else largest_true_near(fits_at, 0, MAX_INDEX, _size_index(near["params"])))
    answer = at(best if best is not None else 0)
    made = _verdict(answer.model, gpu, base, fixed, auto, count, shared=answer)
    if best is not None:
        res.max_params = standard_model(best).params_total
        res.max_shape = shape(best)
        res.next_params = standard_model(best + 1).params_total if best < MAX_INDEX else None
        res.requires = made.requires
    elif made.estimate is not None:  # not even the smallest size: say why when it is not memory
        res.blocked_by = [f.message for f in made.estimate.findings if f.level == "error"]
    res.evaluations = count[0]
    return res


def _size_index(params: int) -> int:
    """The largest standard size with at most ``params`` parameters (0 below the smallest): where the
    bisection starts, since the largest catalog model that fits is usually near the standard answer
    (parameter counts never fall along the family: ``standard_arch``)."""
    return largest_true(lambda i: standard_model(i).params_total <= params, 0, MAX_INDEX) or 0


@dataclass
class MaxModelReport:
    gpu: dict[str, Any]
    world_size: int
    auto: bool
    result: MaxModel
    by_method: list[MaxModel]
    host_memory_bytes: int | None = None

    @property
    def evaluations(self) -> int:
        return sum(m.evaluations for m in self.by_method)

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "world_size": self.world_size, "auto": self.auto,
                "host_memory_bytes": self.host_memory_bytes,
                "usable": {"tokens_per_second": USABLE_TOKENS_PER_S, "samples": REFERENCE_SAMPLES,
                           "avg_tokens": REFERENCE_TOKENS, "hours": USABLE_HOURS},
                **self.result.to_dict(),
                "by_method": [m.to_dict(with_catalog=False) for m in self.by_method]}


def max_model(gpu: str | Accelerator, *, auto: bool = False, host_memory_gib: float | None = None,
              catalog: bool = True, **setup: Any) -> MaxModelReport:
    """Largest catalog model and largest standard size that fit ``gpu`` x ``setup['gpus']``.

    ``catalog=False`` leaves out every catalog model's verdict for the method asked (the JSON's
    ``catalog``; the table shows only the answers), so its scan also stops at the first fit: the
    answers are the same."""
    acc = resolve_accelerator(gpu) if isinstance(gpu, str) else gpu
    variants, base = split_method(setup)
    base = {k: v for k, v in base.items() if k not in SEARCHED} if auto else base
    models = catalog_models()
    # the user's own input must be valid: its error goes through (probed setups swallow theirs)
    world = Prober(standard_model(0), acc, base).check_base(**variants[0][1]).setup.world_size
    host = host_bytes(host_memory_gib)
    if host is not None:
        base = {**base, "host_memory_bytes": host}
    method = setup.get("method") or "lora"
    label = f"qlora-{setup.get('bits') or 4}" if method == "qlora" else method
    by_method = [max_for_method(acc, base, lb, fixed, auto=auto, models=models,
                                whole_catalog=catalog and lb == label)
                 for lb, fixed in METHOD_VARIANTS]
    result = next(m for m in by_method if m.method == label)
    shown = host if host is not None else default_host_bytes(acc, int(base.get("gpus", 1)))
    return MaxModelReport(gpu=acc.to_dict(), world_size=world, auto=auto, result=result, by_method=by_method,
                          host_memory_bytes=shown)
