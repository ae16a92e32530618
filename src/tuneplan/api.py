"""The Python API: the same objects the CLI renders.

    >>> import tuneplan
    >>> est = tuneplan.estimate("qwen2.5-7b-instruct", method="qlora", rank=16, seq=512, gpu="rtx4090")
    >>> est.fits, est.breakdown.allocated_peak_bytes
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field, fields
from typing import Any

from tuneplan.catalog.accelerators import resolve_named
from tuneplan.catalog.models import resolve_model
from tuneplan.env_read import env
from tuneplan.errors import TuneplanError
from tuneplan.estimator.cost import Prices
from tuneplan.estimator.memory import memory_of
from tuneplan.estimator.run import Run, resolve_run
from tuneplan.estimator.runtime import run_time_and_cost
from tuneplan.estimator.throughput import RuntimeOptions
from tuneplan.estimator.types import MemoryBreakdown
from tuneplan.estimator.weights import trainable_params
from tuneplan.specs.dataset import DatasetSpec
from tuneplan.specs.finding import Finding
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import resolve_setup
from tuneplan.specs.setup import TrainSetup, check_fields, field_names
from tuneplan.specs.torch_era import with_switches

__all__ = ["Estimate", "Run", "SETUP_FIELDS", "build_setup", "estimate", "estimate_run", "resolve_run",
           "trainable_params"]

SETUP_FIELDS = {f.name for f in fields(TrainSetup)} - {"sources"}
DEFAULT_PRICES = Prices()


@dataclass
class Estimate:
    model: ModelSpec
    setup: TrainSetup
    breakdown: MemoryBreakdown
    gpu: Accelerator | None = None
    findings: list[Finding] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)  # time / cost sections added by later layers
    # the resolved run behind the figures: ``estimate_run(est.run.reshaped(batch=...))`` re-resolves nothing
    run: Run | None = field(default=None, repr=False, compare=False)

    @property
    def trainable_params(self) -> int:
        return int(self.extras.get("params_trainable", 0))

    @property
    def fits(self) -> bool | None:
        if self.gpu is None:
            return None
        if any(f.level == "error" for f in self.findings):
            return False
        return self.breakdown.device_needed_bytes <= self.gpu.memory_bytes

    @property
    def requires(self) -> list[str]:
        """What the setup runs only with: known breakages for library versions that were not given."""
        return [f.requires for f in self.findings if f.requires]

    @property
    def verdict(self) -> str | None:
        """'fits'; 'runs_only_with' (fits, but a known breakage hits some library versions and these were
        not given: ``requires`` says which work); 'does_not_fit' (memory) or 'cannot_run' (an error
        finding, memory aside); None without a GPU."""
        if self.gpu is None:
            return None
        if self.fits:
            return "runs_only_with" if self.requires else "fits"
        errors = any(f.level == "error" for f in self.findings)
        return "cannot_run" if errors and (self.headroom_bytes or 0) >= 0 else "does_not_fit"

    @property
    def allocator_retries(self) -> bool | None:
        """The verdict fits on what the card must hold while the device peak is above the card: the step
        runs only as the caching allocator frees cached segments and retries (slower); None without a
        GPU."""
        if self.gpu is None:
            return None
        return bool(self.fits) and self.breakdown.device_peak_bytes > self.gpu.memory_bytes

    @property
    def headroom_bytes(self) -> int | None:
        if self.gpu is None:
            return None
        return self.gpu.memory_bytes - self.breakdown.device_needed_bytes

    def to_dict(self) -> dict[str, Any]:
        breakdown = self.breakdown
        result: dict[str, Any] = {
            "model": {**self.model.summary(), "params_trainable": self.trainable_params},
            "setup": self.setup.to_dict(),
            "setup_sources": dict(self.setup.sources),
            "per_gpu": {
                "allocated_peak_bytes": breakdown.allocated_peak_bytes,
                "reserved_peak_bytes": breakdown.reserved_peak_bytes,
                "device_peak_bytes": breakdown.device_peak_bytes,
                "device_needed_bytes": breakdown.device_needed_bytes,
                "cuda_context_bytes": breakdown.cuda_context_bytes,
                "nccl_bytes": breakdown.nccl_bytes,
                "paged_bytes": breakdown.paged_bytes,
                "host_bytes": breakdown.host_bytes,
                "components": dict(breakdown.components),
                "instants": dict(breakdown.instants),
                "bands": {k: {"low": v.low, "high": v.high, "why": v.why}
                          for k, v in breakdown.bands.items()},
                **({"per_card": list(breakdown.per_card)} if breakdown.per_card else {}),
            },
            "peak_instant": breakdown.peak_instant,
            "engine": breakdown.engine,
            "wrapper": breakdown.wrapper,
            "notes": list(breakdown.notes),
            "findings": [f.to_dict() for f in self.findings],
        }
        if self.gpu is not None:
            result["gpu"] = {"name": self.gpu.name, "id": self.gpu.id, "memory_bytes": self.gpu.memory_bytes,
                        "memory_source": self.gpu.memory_source, "platform": self.gpu.platform,
                        "outside_torch_words": list(self.gpu.outside_torch_words)}
            if self.extras.get("gpu_name_choice"):
                result["gpu"]["name_choice"] = self.extras["gpu_name_choice"]
            result["fits"] = self.fits
            result["verdict"] = self.verdict
            if self.requires:
                result["requires"] = self.requires
            result["headroom_bytes"] = self.headroom_bytes
            result["allocator_retries"] = self.allocator_retries
        result.update(self.extras.get("sections", {}))
        return result


# the base of a call given no setup: one frozen record (replace copies it; resolve_setup gives the result
# its own ``sources``), not a new 33-field one per call
DEFAULT_SETUP = TrainSetup()


def build_setup(model: ModelSpec, setup: TrainSetup | None = None, *, accelerator: Accelerator | None = None,
                **kwargs: Any) -> TrainSetup:
    """A validated, profile-resolved TrainSetup (``resolve_setup`` validates it) from a base setup and/or
    keyword fields (and the torch-era switches of calibration rows, specs/torch_era.py)."""
    base, kwargs = with_switches(setup or DEFAULT_SETUP, kwargs)
    unknown = kwargs.keys() - field_names(type(base)) - SETUP_FIELDS
    if unknown:
        raise TuneplanError(f"unknown setup field(s) {sorted(unknown)}", field="setup",
                            accepted=sorted(SETUP_FIELDS))
    explicit = frozenset(kwargs) | frozenset(k for k, v in base.sources.items() if v != "default")
    train_setup = base.replace(**kwargs) if kwargs else base
    bf16 = accelerator.supports_bf16 if accelerator is not None else None
    return resolve_setup(train_setup, model, explicit=explicit, supports_bf16=bf16)


def estimate(model: str | ModelSpec, setup: TrainSetup | None = None, *, gpu: str | Accelerator | None = None,
             engine: str = "analytic", hardware_file: str | None = None, dataset: DatasetSpec | None = None,
             price: float | None = None, card_price: float | None = None, kwh_price: float | None = None,
             own_years: float | None = None, time_options: RuntimeOptions | None = None,
             timing: bool = True, versions: dict[str, Any] | None = None, **kwargs: Any) -> Estimate:
    """Per-GPU peak memory (and findings) of fine-tuning ``model`` with ``setup`` on ``gpu``.

    With a GPU, the result also carries ``time`` and ``cost`` sections (``estimator/runtime.py``); the
    totals need ``dataset``; ``price`` (USD per GPU-hour), ``card_price``, ``kwh_price`` and ``own_years``
    override the catalog's prices and the cost model's defaults. ``versions`` (the keys of
    ``tuneplan.compat``): the library versions the run will use, so that version-dependent breakages are
    answered for them instead of stated as a condition."""
    if hardware_file is not None and not isinstance(gpu, str):
        import warnings

        # its cards are only what a GPU name is looked up in: without one (or with an Accelerator) unused
        warnings.warn("the hardware file is not used: it adds cards that a GPU name ({gpu}) can name, and "
                      "no GPU name was given", stacklevel=2)
    if engine not in ("analytic", "simulate"):
        raise TuneplanError(f"unknown engine {engine!r}", field="engine", accepted="analytic, simulate")
    accelerator, choice, run = resolved(model, setup, gpu, hardware_file, kwargs)
    est = estimate_run(run, gpu=accelerator, engine=engine, dataset=dataset, price=price,
                       card_price=card_price, kwh_price=kwh_price, own_years=own_years,
                       time_options=time_options, timing=timing,
                       versions=versions)
    if choice:
        est.extras["gpu_name_choice"] = choice
    return est


# Resolved runs of recent ``estimate`` calls, so that a loop over sizes resolves once: (key) -> the card,
# the run as first resolved, and its reshaped runs by (batch, seq, grad_accum). The key holds everything
# the resolve reads (resolved_key), and keeps the objects whose identity is in the key alive (so no other
# object takes that identity while it is cached); at most RESOLVED_MAX keys and SHAPES_MAX shapes per key.
Shapes = dict[tuple[int, int, int], Run]
_RESOLVED: dict[tuple[Any, ...], tuple[Accelerator | None, Any, Run, Shapes, tuple[Any, ...]]] = {}
RESOLVED_MAX = 256
SHAPES_MAX = 256
SHAPE = ("batch", "seq", "grad_accum")  # what a resolved run is reshaped to (Run.reshaped)


def resolved(model: str | ModelSpec, setup: TrainSetup | None, gpu: str | Accelerator | None,
             hardware_file: str | None, kwargs: dict[str, Any]) -> tuple[Accelerator | None, Any, Run]:
    """The card, how its name was chosen (``resolve_named``) and the resolved run of an ``estimate``
    call, from the cache when an earlier call differed only in the values of ``batch`` / ``seq`` /
    ``grad_accum`` (the run is then reshaped, its shape checked as ``TrainSetup.validate`` checks it)."""
    key = resolved_key(model, setup, gpu, hardware_file, kwargs)
    hit = _RESOLVED.get(key) if key is not None else None
    if hit is not None:
        accelerator, choice, run, shapes, _kept = hit
        given = {k: kwargs[k] for k in SHAPE if k in kwargs}
        # what TrainSetup.validate checks of these fields: each alone, no other reads them
        check_fields(given)
        shape_key = (given.get("batch", run.setup.batch), given.get("seq", run.setup.seq),
              given.get("grad_accum", run.setup.grad_accum))
        got = shapes.get(shape_key)
        if got is None:
            shape = {k: v for k, v in given.items() if v != getattr(run.setup, k)}
            got = run.reshaped(**shape) if shape else run
            if len(shapes) >= SHAPES_MAX:
                shapes.clear()
            shapes[shape_key] = got
        return accelerator, choice, got
    spec = resolve_model(model) if isinstance(model, str) else model
    accelerator, choice = resolve_named(gpu, extra=hardware_file) if isinstance(gpu, str) else (gpu, None)
    run = resolve_run(spec, build_setup(spec, setup, accelerator=accelerator, **kwargs))
    if key is not None:
        if len(_RESOLVED) >= RESOLVED_MAX:
            _RESOLVED.clear()
        shapes = {(run.setup.batch, run.setup.seq, run.setup.grad_accum): run}
        _RESOLVED[key] = (accelerator, choice, run, shapes, (model, gpu, setup))
    return accelerator, choice, run


def resolved_key(model: Any, setup: Any, gpu: Any, hardware_file: Any,
                 kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """What the resolve reads, as a key; None when something in it cannot be a key (then no cache).

    - the model: a ModelSpec object (its identity: specs are frozen; the entry keeps the object, so the
      identity is not reused while it is cached), or the name and, for a path, the config file's
      modification time and size (for a hub id, the hub settings the fetch reads);
    - the card: an Accelerator object (its identity, kept the same way), or the name, the hardware files
      read (``--hardware-file`` and the user's config-dir files) with their modification times;
    - the base setup object (frozen; its identity, kept), every keyword field's value but the shape's,
      and which shape fields were given (they are recorded as given in ``setup.sources``)."""
    try:
        rest = tuple(sorted((k, v) for k, v in kwargs.items() if k not in SHAPE))
        hash(rest)
    except TypeError:
        return None
    shape_given = tuple(k for k in SHAPE if k in kwargs)
    m = ("spec", id(model)) if not isinstance(model, str) else ("name", model, _model_stamp(model))
    card_key = (("card", id(gpu)) if not isinstance(gpu, str) else
         ("name", gpu, _file_stamp(hardware_file), _hardware_stamp()))
    return (m, card_key, id(setup), rest, shape_given)


def _file_stamp(path: Any) -> tuple[Any, ...] | None:
    if path is None:
        return None
    try:
        file_stat = os.stat(path)
    except (OSError, TypeError, ValueError):
        return (str(path), None)
    return (str(path), file_stat.st_mtime_ns, file_stat.st_size)


def _model_stamp(name: str) -> tuple[Any, ...]:
    """A path's config file (a folder's config.json), or the hub settings a hub id is fetched with."""
    config_path = os.path.expanduser(name.strip())
    try:
        file_stat = os.stat(config_path)
        if stat.S_ISDIR(file_stat.st_mode):
            config_path = os.path.join(config_path, "config.json")
            file_stat = os.stat(config_path)
        return ("file", config_path, file_stat.st_mtime_ns, file_stat.st_size)
    except (OSError, ValueError):
        return ("hub", env("HF_HUB_OFFLINE"), env("HF_ENDPOINT"))


def _hardware_stamp() -> tuple[Any, ...]:
    """The user's config-dir hardware files (``catalog.accelerators.hardware_file_candidates``): their
    folder, and each file's time and size when the folder exists (a file is added, removed or edited)."""
    from tuneplan.catalog.accelerators import hardware_file_candidates

    files = hardware_file_candidates()
    folder = _file_stamp(os.path.dirname(files[0]))
    if folder is None or folder[1] is None:
        return (folder,)
    return (folder, *map(_file_stamp, files))


def estimate_run(run: Run, *, gpu: Accelerator | None = None, engine: str = "analytic",
                 dataset: DatasetSpec | None = None, price: float | None = None,
                 card_price: float | None = None,
                 kwh_price: float | None = None, own_years: float | None = None,
                 time_options: RuntimeOptions | None = None, timing: bool = True,
                 versions: dict[str, Any] | None = None) -> Estimate:
    """``estimate`` on a run already resolved (``estimator.run.resolve_run``; ``run.reshaped(batch=, seq=)``
    for another shape): nothing is looked up or resolved again."""
    spec, train_setup, accelerator = run.model, run.setup, gpu
    if engine == "analytic" and train_setup.device_map != "none" and train_setup.gpus > 1:
        from tuneplan.estimator.device_map import device_map_breakdown

        breakdown = device_map_breakdown(run, accelerator)
    elif engine == "analytic":
        breakdown = memory_of(run)
    elif engine == "simulate" and train_setup.device_map != "none" and train_setup.gpus > 1:
        from tuneplan.simulate.device_map import simulate_device_map

        breakdown = simulate_device_map(run, accelerator)
    elif engine == "simulate":
        from tuneplan.simulate import simulate_breakdown  # optional extra, imported lazily

        breakdown = simulate_breakdown(spec, train_setup)
    else:
        raise TuneplanError(f"unknown engine {engine!r}", field="engine", accepted="analytic, simulate")
    extras: dict[str, Any] = {"params_trainable": run.trainable_params}
    if accelerator is not None and timing:  # searches that only need the memory verdict skip time and cost
        if price is None and card_price is None and kwh_price is None and own_years is None:
            prices = DEFAULT_PRICES  # one object: the run's kept cost rates match it by identity
        else:
            _check_price_arguments(price=price, card_price=card_price, kwh_price=kwh_price,
                                   own_years=own_years)
            prices = Prices(cloud_usd_per_gpu_hr=price, card_price_usd=card_price,
                            **{k: v for k, v in (("kwh_price", kwh_price), ("own_years", own_years))
                               if v is not None})
        extras["sections"] = run_time_and_cost(run, accelerator, dataset, prices, time_options,
                                               memory=breakdown if engine == "analytic" else None)
    if versions is None:
        findings = run.findings(accelerator)
    else:
        from tuneplan.compat import check

        findings = check(accelerator, train_setup, spec, versions)
    if train_setup.device_map != "none":  # one card too: accelerate may still leave layers on the CPU
        from tuneplan.estimator.device_map import spill_finding

        findings.extend(f for f in (spill_finding(run, accelerator),) if f is not None)
    # positional, in Estimate's field order (model, setup, breakdown, gpu, findings, extras, run): every
    # estimate makes one, and its keywords cost a third of a microsecond
    return Estimate(spec, train_setup, breakdown, accelerator, findings, extras, run)


def _check_price_arguments(**values: float | None) -> None:
    """Each price argument finite and in 0..MAX_PRICE, refused under its own name (``price``, not the
    ``Prices`` field it fills), before any total is formed: ``price=10**400`` is bad input, not an
    OverflowError."""
    from tuneplan.specs.limits import MAX_PRICE, check_number

    for name, value in values.items():
        if value is not None:
            check_number(name, value, 0.0, MAX_PRICE)

