"""The page's form as data: every field, its default and choices, and how raw widget values become the
core's inputs (a ModelSpec, TrainSetup keywords, an Accelerator).

No gradio here, so the conversion is unit-tested without a browser. The rules are the CLI's: a field
left at "profile default" is not passed (the framework profile fills it and ``setup_sources`` says so),
and every value is validated by the core (``TrainSetup.validate``, ``resolve_model``,
``resolve_accelerator``), never by a second copy of the rules here. Errors are collected per group
of fields, so each message is shown next to the fields it concerns.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import (
    ATTENTIONS,
    FRAMEWORKS,
    LOSSES,
    METHODS,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    TrainSetup,
)

AUTO = "profile default"  # a choice meaning "do not pass this field"
GC_CHOICES = (AUTO, "on", "off")
TARGET_CHOICES = (AUTO, "q_proj,v_proj", "attn", "mlp", "all-linear")
CONFIG_MAX_CHARS = 1_000_000  # a config.json is a few KiB; refuse pasted megabytes

# Form fields in the order the page passes them to callbacks: name -> default.
DEFAULTS: dict[str, Any] = {
    "model": "Qwen/Qwen2.5-7B-Instruct",
    "config_text": "",
    "method": "qlora",
    "bits": "4",
    "rank": 16,
    "targets": AUTO,
    "precision": AUTO,
    "optimizer": AUTO,
    "batch": 1,
    "seq": 512,
    "grad_accum": 1,
    "gradient_checkpointing": AUTO,
    "attn": AUTO,
    "loss": AUTO,
    "compile": False,
    "activation_offload": False,
    "num_labels": "",  # empty: the language-model head
    "framework": "hf",
    "gpu": "rtx-4090",
    "gpus": 1,
    "nodes": 1,
    "zero": "0",
    "fsdp": False,
    "offload": "none",
    "samples": 10_000,
    "avg_tokens": "",
    "epochs": 1,
    "packing": False,
}
FIELDS: tuple[str, ...] = tuple(DEFAULTS)

CHOICES: dict[str, tuple[str, ...]] = {
    "method": METHODS,
    "bits": ("4", "8"),
    "targets": TARGET_CHOICES,
    "precision": (AUTO, *PRECISIONS),
    "optimizer": (AUTO, *OPTIMIZERS),
    "gradient_checkpointing": GC_CHOICES,
    "attn": (AUTO, *ATTENTIONS),
    "loss": (AUTO, *LOSSES),
    "framework": FRAMEWORKS,
    "zero": ("0", "1", "2", "3"),
    "offload": OFFLOADS,
}

# Which message slot (shown under which group of fields) a field's error goes to.
GROUPS = ("model", "setup", "hardware", "dataset")
HARDWARE_FIELDS = frozenset({"gpu", "gpus", "nodes", "zero", "fsdp", "offload"})
DATASET_FIELDS = frozenset({"samples", "avg_tokens", "epochs", "packing", "dataset_tokens", "dataset"})


def group_of(field_name: str | None) -> str:
    f = (field_name or "").split(".")[0]
    if f in HARDWARE_FIELDS:
        return "hardware"
    if f in DATASET_FIELDS:
        return "dataset"
    if f in ("model", "config", "config_text"):
        return "model"
    return "setup"


@dataclass
class Parsed:
    """The core's inputs read from the form, or the messages that stopped them, by group."""

    model: ModelSpec | None = None
    setup_kw: dict[str, Any] = field(default_factory=dict)
    gpu: Accelerator | None = None
    samples: int | None = None
    avg_tokens: float | None = None
    epochs: float | None = None
    packing: bool = False
    errors: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def fail(self, group: str, message: str) -> None:
        self.errors[group] = f"{self.errors[group]}\n{message}" if group in self.errors else message

    @property
    def ok(self) -> bool:
        return not self.errors


def whole(name: str, value: Any, *, minimum: int = 1) -> int:
    """A widget number as an int, or a TuneplanError naming the field (floats like 16.0 are fine)."""
    if value is None or value == "":
        raise TuneplanError("is empty", field=name, accepted=f"an integer >= {minimum}")
    if isinstance(value, bool):
        raise TuneplanError(f"got {value!r}", field=name, accepted=f"an integer >= {minimum}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise TuneplanError(f"{value!r} is not a number", field=name, accepted=f"an integer >= {minimum}") from None
    if not math.isfinite(f) or f != int(f):
        raise TuneplanError(f"{value!r} is not a whole number", field=name, accepted=f"an integer >= {minimum}")
    if int(f) < minimum:
        raise TuneplanError(f"must be at least {minimum}, got {int(f)}", field=name,
                            accepted=f"an integer >= {minimum}")
    return int(f)


def setup_kwargs(v: dict[str, Any]) -> dict[str, Any]:
    """TrainSetup keywords the user set, as the CLI's flags would pass them. Raises TuneplanError."""
    method = v.get("method") or DEFAULTS["method"]
    kw: dict[str, Any] = {"method": method}
    if method == "qlora":  # the bits widget is shown for QLoRA only; the CLI rejects --bits elsewhere
        kw["bits"] = whole("bits", v.get("bits"))
    if method in ("lora", "qlora"):
        kw["rank"] = whole("rank", v.get("rank"))
        targets = (v.get("targets") or AUTO).strip()
        if targets != AUTO:
            kw["targets"] = targets
    for name in ("precision", "optimizer", "attn", "loss"):
        val = v.get(name) or AUTO
        if val != AUTO:
            kw[name] = val
    gc = v.get("gradient_checkpointing") or AUTO
    if gc != AUTO:
        kw["gradient_checkpointing"] = gc == "on"
    for name in ("batch", "seq", "grad_accum", "gpus", "nodes"):
        kw[name] = whole(name, v.get(name))
    kw["zero"] = whole("zero", v.get("zero", "0"), minimum=0)
    kw["fsdp"] = bool(v.get("fsdp"))
    kw["offload"] = v.get("offload") or "none"
    kw["framework"] = v.get("framework") or DEFAULTS["framework"]
    for name in ("compile", "activation_offload"):
        if v.get(name):
            kw[name] = True
    labels = v.get("num_labels")
    if labels not in (None, "") and str(labels).strip():
        kw["num_labels"] = whole("num_labels", str(labels).strip())
    return kw


@lru_cache(maxsize=128)
def _catalog_or_hub_model(name: str) -> tuple[ModelSpec, tuple[str, ...]]:
    """Resolved once per name (a Hub id costs a network round trip); failures are not cached."""
    from tuneplan.catalog.models import resolve_model

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = resolve_model(name)
    return spec, tuple(str(w.message) for w in caught)


@lru_cache(maxsize=32)
def _pasted_model(text: str) -> tuple[ModelSpec, tuple[str, ...]]:
    """A pasted config.json, parsed once per text (every field change re-reads the form)."""
    from tuneplan.specs.model import model_from_config

    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TuneplanError(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                            field="config", accepted="a Hugging Face config.json") from None
    name = str(cfg.get("_name_or_path") or "pasted config.json") if isinstance(cfg, dict) else "pasted config.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = model_from_config(cfg, name=name)
    return spec, tuple(str(w.message) for w in caught)


def read_model(name: str | None, config_text: str | None) -> tuple[ModelSpec, list[str]]:
    """The model: a pasted/uploaded config.json wins over the name. Raises TuneplanError (field model)."""
    text = (config_text or "").strip()
    if text:
        if len(text) > CONFIG_MAX_CHARS:
            raise TuneplanError(f"config.json is {len(text):,} characters; a model config is a few KiB",
                                field="config", accepted="a Hugging Face config.json")
        spec, notes = _pasted_model(text)
        return spec, list(notes)
    name = (name or "").strip()
    if not name:
        raise TuneplanError("choose a model", field="model",
                            accepted="a catalog name, a Hugging Face id, or paste a config.json")
    # A page may be served to others: it never reads paths on the server's disk.
    if name.endswith(".json") or name.startswith(("/", ".", "~", "\\")) or ":" in name:
        raise TuneplanError("the page does not read files on the server", field="model",
                            accepted="a catalog name or Hugging Face id; paste or upload the config.json instead")
    spec, notes = _catalog_or_hub_model(name)
    return spec, list(notes)


def read_gpu(name: str | None) -> Accelerator | None:
    from tuneplan.catalog.accelerators import resolve_accelerator

    name = (name or "").strip()
    return resolve_accelerator(name) if name else None


def parse(values: dict[str, Any]) -> Parsed:
    """All the form's inputs at once, each group's error kept for its own message slot."""
    v = {**DEFAULTS, **values}
    p = Parsed()
    try:
        p.model, p.notes = read_model(v.get("model"), v.get("config_text"))
    except TuneplanError as exc:
        p.fail("model", str(exc))
    try:
        p.setup_kw = setup_kwargs(v)
        # The core's validation, the same the CLI runs; repeated with the model by build_setup later.
        TrainSetup(**p.setup_kw).validate()
    except TuneplanError as exc:
        p.fail(group_of(exc.field), str(exc))
    try:
        p.gpu = read_gpu(v.get("gpu"))
    except TuneplanError as exc:
        p.fail("hardware", str(exc))
    try:
        p.samples = whole("samples", v.get("samples"))
        epochs = v.get("epochs")
        if epochs is None or epochs == "" or not math.isfinite(float(epochs)) or float(epochs) <= 0:
            raise TuneplanError(f"got {epochs!r}", field="epochs", accepted="a number > 0 (e.g. 1, 3, 0.5)")
        p.epochs = float(epochs)
        avg = v.get("avg_tokens")
        if avg is not None and str(avg).strip() != "":
            try:
                a = float(avg)
            except ValueError:
                a = math.nan
            if not math.isfinite(a) or a <= 0:
                raise TuneplanError(f"got {avg!r}", field="avg_tokens",
                                    accepted="tokens per sample after the chat template, e.g. 350; empty: fills seq")
            p.avg_tokens = a
        p.packing = bool(v.get("packing"))
    except (TypeError, ValueError) as exc:  # TuneplanError is a ValueError
        p.fail("dataset", str(exc) if isinstance(exc, TuneplanError) else f"dataset: {exc}")
    return p
