"""Several config files + command-line flags -> one set of TrainSetup fields, each with its origin.

Order of precedence: flags, then files in the order given (a later file wins a conflict, with a
warning: the real launcher would usually refuse the mismatch), then hints (a BitsAndBytesConfig's
compute dtype, a PEFT config's method) that only fill what nothing else says. A DeepSpeed file named
inside another file (LLaMA-Factory/axolotl ``deepspeed:``, TrainingArguments ``deepspeed``, accelerate
``deepspeed_config_file``) is read too, unless a DeepSpeed file is given explicitly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tuneplan.errors import ConfigError, TuneplanError
from tuneplan.estimator.wrappers.zero_terms import DS_PREFETCH_BUCKET, DS_REDUCE_BUCKET
from tuneplan.ingest.common import Ingested
from tuneplan.ingest.deepspeed import resolve_buckets
from tuneplan.ingest.read import read_config, read_inline_deepspeed
from tuneplan.specs.setup import TrainSetup

SETUP_FIELDS = frozenset(f.name for f in fields(TrainSetup)) - {"sources"}


@dataclass
class Resolved:
    """The run the files and flags describe."""

    model: str | None
    model_source: str | None
    setup_kw: dict[str, Any]
    sources: dict[str, str]
    warnings: list[str] = field(default_factory=list)
    files: list[Ingested] = field(default_factory=list)
    deepspeed: dict[str, Any] | None = None  # stage, buckets (resolved), overlap_comm, offload devices
    run: dict[str, Any] = field(default_factory=dict)  # epochs, max_steps, max_samples, dataset

    def base_setup(self) -> TrainSetup:
        """A TrainSetup carrying only the origins; pass ``setup_kw`` as the fields."""
        return TrainSetup(sources=dict(self.sources))

    def dataset_fields(self) -> tuple[dict[str, Any], str] | None:
        """How much data the files say the run reads, as DatasetSpec fields, with why; None if unknown.

        ``max_steps`` > 0 fixes the rows (steps x micro-batch x accumulation x GPUs, one epoch);
        LLaMA-Factory's ``max_samples`` caps the samples (an upper bound: the dataset may be smaller).
        """
        run, kw = self.run, self.setup_kw
        epochs = run.get("num_train_epochs", run.get("num_epochs"))
        packing = bool(run.get("packing", False))
        if run.get("max_steps", -1) > 0:
            rows = int(run["max_steps"]) * kw.get("batch", 1) * kw.get("grad_accum", 1) * \
                kw.get("gpus", 1) * kw.get("nodes", 1)
            return {"samples": rows, "epochs": 1.0}, f"max_steps {int(run['max_steps'])} x the global batch"
        if run.get("max_samples"):
            return ({"samples": int(run["max_samples"]), "epochs": float(epochs or 1.0), "packing": packing},
                    f"max_samples {run['max_samples']} (an upper bound), {epochs or 1:g} epochs")
        return None


def _find_reference(path: str, named_in: str) -> Path | None:
    """Where a file named inside another lives: as given (cwd), beside the naming file, or above it
    (LLaMA-Factory examples name ``examples/deepspeed/x.json`` relative to the repository root)."""
    from tuneplan.errors import TuneplanError
    from tuneplan.safe_read import path_exists, user_path

    try:
        p = user_path(path, "deepspeed")
    except TuneplanError:  # no such home directory, a name too long: a file that cannot be found
        return None
    if p.is_absolute():
        return p if path_exists(p) else None
    candidates = [p]
    base = Path(named_in).parent
    for folder in (base, *base.parents):
        candidates.append(folder / p)
    candidates.append(base / p.name)
    return next((c for c in candidates if path_exists(c) and c.is_file()), None)


def _guess_from_name(path: str, where: str) -> Ingested:
    """A DeepSpeed file that cannot be found: take the stage/offload its name announces (LLaMA-Factory's
    ds_z3_offload_config.json, axolotl's zero2.json) rather than silently estimating without ZeRO."""
    out = Ingested(path=path, kind="deepspeed", label="deepspeed file name")
    name = Path(path).name.lower()
    m = re.search(r"z(?:ero)?[_-]?([0-3])", name)
    msg = f"{where}: deepspeed config {path!r} not found (looked beside the file and in its parent folders)"
    if m:
        stage = int(m.group(1))
        out.fields["zero"] = stage
        out.sources["zero"] = f"deepspeed file name {Path(path).name} ({where}; file not found)"
        if "offload" in name and stage:
            out.fields["offload"] = "all" if stage == 3 else "optimizer"
            out.sources["offload"] = out.sources["zero"]
        msg += f"; taking ZeRO-{stage}{' with offload' if 'offload' in name else ''} from its name"
    else:
        msg += "; estimated without DeepSpeed: give it with {from}"
    out.warnings.append(msg)
    return out


def _read_all(specs: list[str]) -> list[Ingested]:
    explicit = [read_config(s) for s in specs]
    explicit_ds = [i for i in explicit if i.kind == "deepspeed"]
    out: list[Ingested] = []
    for ing in explicit:
        out.append(ing)
        if "inline_deepspeed" in ing.extras and not explicit_ds:
            out.append(read_inline_deepspeed(ing.extras["inline_deepspeed"], f"{ing.path}:deepspeed"))
        for kind, ref, where in ing.references:
            if kind != "deepspeed":
                continue
            if explicit_ds:
                names = {Path(d.path).resolve() for d in explicit_ds}
                found = _find_reference(ref, ing.path)
                if found is None or found.resolve() not in names:
                    ing.warnings.append(f"{where}: names {ref!r}; using the DeepSpeed file given with "
                                        f"{{from}}")
                continue
            found = _find_reference(ref, ing.path)
            out.append(read_config(str(found), kind="deepspeed") if found else _guess_from_name(ref, where))
    return out


def read_configs(files: list[str] | tuple[str, ...], setup_kw: dict[str, Any] | None = None,
                 model: str | None = None) -> Resolved:
    """Read ``files`` (paths, or ``KIND:PATH``), apply ``setup_kw`` (flags) over them."""
    ingested = _read_all(list(files))
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    warnings: list[str] = []
    hints: dict[str, tuple[Any, str]] = {}
    for ing in ingested:
        warnings.extend(ing.warnings)
        for name, value in ing.fields.items():
            src = ing.sources.get(name, ing.path)
            if name in ing.weak:
                hints.setdefault(name, (value, src))
                continue
            if name in merged and merged[name] != value:
                warnings.append(f"{name}: {sources[name]} says {merged[name]!r}, {src} says {value!r}; "
                                f"using {value!r} (the later file); the launcher may refuse the mismatch")
            merged[name] = value
            sources[name] = src
    for name, (value, src) in hints.items():
        if name not in merged:
            merged[name] = value
            sources[name] = src
    unknown = set(merged) - SETUP_FIELDS
    assert not unknown, f"reader produced non-setup fields {unknown}"  # a reader bug, not user input

    flags = dict(setup_kw or {})
    for name, value in flags.items():
        merged[name] = value
        sources[name] = "flag"
    for ing in ingested:
        for name, msg in ing.extras.get("missing", {}).items():
            if name not in merged:
                warnings.append(msg)

    ds_files = [i for i in ingested if "deepspeed" in i.extras]
    world = next((i.extras["world_size"] for i in reversed(ingested) if "world_size" in i.extras), None)
    if world is not None:
        n, src = world
        nodes = merged.get("nodes", 1)
        if "gpus" not in merged:
            if n % nodes:
                warnings.append(f"{src}: world size {n} does not split over {nodes} nodes; give {{gpus}}")
            else:
                merged["gpus"] = n // nodes
                sources["gpus"] = f"{src} (train_batch_size / (micro-batch x accumulation) / nodes)"
        elif merged["gpus"] * nodes != n:
            warnings.append(f"{src}: train_batch_size implies {n} GPUs but the run has {merged['gpus']} x "
                            f"{nodes}; DeepSpeed asserts train_batch_size = micro x accumulation x GPUs")

    model_name, model_source = model, "argument" if model else None
    file_models = [(i.model, i.model_source) for i in ingested if i.model]
    if file_models:
        if model is None:
            model_name, model_source = file_models[-1]
        elif file_models[-1][0] != model:
            warnings.append(f"MODEL argument {model!r} overrides {file_models[-1][1]} "
                            f"({file_models[-1][0]!r})")

    spec = _model_spec(model_name)
    ds = None
    if ds_files:
        ds = dict(ds_files[-1].extras["deepspeed"])
        ds["file_buckets"] = dict(ds.get("buckets", {}))
        ds["buckets"] = resolve_buckets(ds, spec.hidden if spec is not None else None)
        _bucket_warnings(ds, warnings, ds_files[-1].path)
        for name, field in (("reduce_bucket_size", "ds_reduce_bucket"),
                            ("stage3_prefetch_bucket_size", "ds_prefetch_bucket")):
            value = ds["buckets"].get(name)
            default = {"ds_reduce_bucket": DS_REDUCE_BUCKET, "ds_prefetch_bucket": DS_PREFETCH_BUCKET}[field]
            if isinstance(value, int) and value > 0 and value != default and field not in merged:
                merged[field] = value
                how = "auto: as transformers fills it" if ds["file_buckets"].get(name) == "auto" else name
                sources[field] = f"{ds_files[-1].path} ({how})"
    run: dict[str, Any] = {}
    for ing in ingested:
        run.update(ing.extras.get("run", {}))
    _validate(merged, sources, bool(ds_files))
    if spec is not None and merged.get("targets") and merged.get("method", "lora") in ("lora", "qlora"):
        _check_targets(spec, merged["targets"], sources.get("targets"))
    return Resolved(model=model_name, model_source=model_source, setup_kw=merged, sources=sources,
                    warnings=warnings, files=ingested, deepspeed=ds, run=run)


def merge_from_files(files: list[str] | tuple[str, ...], setup_kw: dict[str, Any] | None,
                     model: str
                     | None = None) -> tuple[str | None, dict[str, Any], dict[str, str], list[str]]:
    """One-line helper for commands: ``(model_name, setup_kw, sources, warnings)`` from files + flags.

    Pass ``setup_kw`` (fields) and ``TrainSetup(sources=sources)`` as the base setup to the API.
    """
    r = read_configs(files, setup_kw, model)
    return r.model, r.setup_kw, r.sources, r.warnings


def _model_spec(model: str | None):  # -> ModelSpec | None; catalog or local file only, no download
    if not model:
        return None
    try:
        from tuneplan.catalog.models import resolve_model

        return resolve_model(model, allow_network=False)
    except (TuneplanError, OSError, ValueError):
        return None


def _check_targets(spec: Any, targets: str, src: str | None) -> None:
    """LoRA targets the architecture lacks: say which file line named them."""
    from tuneplan.specs.lora_targets import resolve_targets

    try:
        resolve_targets(spec, targets)
    except TuneplanError as exc:
        if src and src != "flag":
            raise ConfigError(f"{exc.message} (value from {src})", field="targets",
                              accepted=exc.accepted) from None
        raise


def _bucket_warnings(ds: dict[str, Any], warnings: list[str], path: str) -> None:
    """Buckets the estimate cannot use: "auto" without a known model hidden size."""
    if not ds.get("stage"):
        return
    unresolved = [name for name, value in ds["buckets"].items()
                  if name in ("reduce_bucket_size", "stage3_prefetch_bucket_size")
                  and not isinstance(value, int)]
    if unresolved:
        warnings.append(f"{path}: {', '.join(unresolved)} is \"auto\" and the model's hidden size is "
                        f"unknown; "
                        "the estimate uses DeepSpeed's default buckets for it")


def _validate(merged: dict[str, Any], sources: dict[str, str], has_ds: bool) -> None:
    """Check the combination now, so an error names the file and line a value came from."""
    try:
        TrainSetup(**{k: v for k, v in merged.items() if k in SETUP_FIELDS}).validate()
    except TuneplanError as exc:
        f = exc.field or ""
        src = sources.get(f)
        msg = exc.message
        if f in ("zero", "fsdp") and "gpus" not in merged:
            msg += ("; the files do not say how many GPUs run (torchrun / accelerate launch decide): "
                    "give {gpus=N}")
        if src and src != "flag":
            raise ConfigError(f"{msg} (value from {src})", field=f, accepted=exc.accepted,
                              field_is_key=False) from None
        raise ConfigError(msg, field=f or None, accepted=exc.accepted, field_is_key=False) from None
