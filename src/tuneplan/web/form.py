"""The page's form as data: every field, its default and choices, and how raw widget values become the
core's inputs (a ModelSpec, TrainSetup keywords, an Accelerator).

No gradio here, so the conversion is unit-tested without a browser. The rules are the CLI's: a field
left at "profile default" is not passed (the framework profile fills it and ``setup_sources`` says so),
and every value is validated by the core (``TrainSetup.validate``, ``model_from_config``,
``resolve_accelerator``), never by a second copy of the rules here. What the page adds is its own:
where a model may come from (``sources``: never a server path) and how large a request may be
(``limits``: ceilings checked before any estimate). Errors are collected per group of fields, so each
message is shown next to the fields it concerns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.specs import fields as field_table
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
from tuneplan.web import limits, sources
from tuneplan.web.wording import page_error

AUTO = "profile default"  # a choice meaning "do not pass this field"
GC_CHOICES = (AUTO, "on", "off")
TARGET_CHOICES = (AUTO, "q_proj,v_proj", "attn", "mlp", "all-linear")
CONFIG_MAX_CHARS = limits.PASTE_MAX_BYTES  # a config.json is a few KiB; refuse pasted megabytes

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


def widget_kind(f: field_table.Field) -> str:
    """The widget a row names; a dropdown or radio without a vocabulary (a range in words) is a textbox."""
    if f.widget in ("dropdown", "radio") and not isinstance(f.accepted, tuple):
        return "textbox"
    return f.widget


def widget_default(f: field_table.Field) -> Any:
    """The form value of a generated widget before the user touches it: the setup's default, or
    ``AUTO`` for a choice the profile makes (default None)."""
    kind = widget_kind(f)
    if kind == "checkbox":
        return bool(f.default)
    if kind in ("dropdown", "radio"):
        return AUTO if f.default is None else str(f.default)
    if kind == "textbox":
        return "" if f.default is None else str(f.default)
    return f.default


# Setup fields the page does not lay out by hand (the ones above): a widget generated from the field table
# for each row that names one, placed under "more settings" (page.py), read by setup_kwargs.
GENERATED: tuple[field_table.Field, ...] = tuple(
    f for f in field_table.FIELDS if f.widget != "none" and f.name not in DEFAULTS)
DEFAULTS.update({f.name: widget_default(f) for f in GENERATED})
FIELDS: tuple[str, ...] = tuple(DEFAULTS)

CHOICES: dict[str, tuple[str, ...]] = {
    **{f.name: (*((AUTO,) if f.default is None else ()), *map(str, f.accepted))
       for f in GENERATED if widget_kind(f) in ("dropdown", "radio")},
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


def shown(value: Any, most: int = 40) -> str:
    """A user's value quoted for a message, cut to ``most`` characters (any type, any size)."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4,300-digit str() limit
        return "a number with thousands of digits"
    return text if len(text) <= most else text[: most - 3] + "..."


def _number(name: str, value: Any, accepted: str) -> float:
    """A widget number as a finite float, or a TuneplanError naming the field."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise TuneplanError("is empty", field=name, accepted=accepted)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TuneplanError(f"got {shown(value)}", field=name, accepted=accepted)
    try:
        f = float(value)
    except (ValueError, OverflowError):
        raise TuneplanError(f"{shown(value)} is not a number", field=name, accepted=accepted) from None
    if not math.isfinite(f):
        raise TuneplanError(f"{shown(value)} is not a finite number", field=name, accepted=accepted)
    return f


def whole(name: str, value: Any, *, minimum: int = 1) -> int:
    """A widget number as an int, or a TuneplanError naming the field (floats like 16.0 are fine).

    Values above the page's ceiling for the field (``limits.FORM_MAX``) are refused too.
    """
    accepted = f"an integer >= {minimum}"
    f = _number(name, value, accepted)
    if f != int(f):
        raise TuneplanError(f"{shown(value)} is not a whole number", field=name, accepted=accepted)
    if int(f) < minimum:
        raise TuneplanError(f"must be at least {minimum}, got {int(f)}", field=name, accepted=accepted)
    limits.check_form_number(name, f)
    return int(f)


def positive(name: str, value: Any, *, maximum: float, accepted: str) -> float:
    """A widget number > 0 and at most ``maximum``, or a TuneplanError naming the field."""
    f = _number(name, value, accepted)
    if not 0 < f <= maximum:
        raise TuneplanError(f"got {shown(value)}", field=name, accepted=f"{accepted}; at most {maximum:,g}")
    return f


def choice(name: str, value: Any, default: str) -> str:
    """A text widget's value (empty: ``default``); anything but text is refused, naming the field."""
    if value is None or value == "":
        return default
    accepted = ", ".join(CHOICES.get(name, ())) or "a name"
    if not isinstance(value, str):
        raise TuneplanError(f"got {shown(value)}", field=name, accepted=accepted)
    if len(value) > limits.NAME_MAX_CHARS:
        raise TuneplanError(f"is {len(value):,} characters long", field=name, accepted=accepted)
    return value.strip() or default


def setup_kwargs(v: dict[str, Any]) -> dict[str, Any]:
    """TrainSetup keywords the user set, as the CLI's flags would pass them. Raises TuneplanError."""
    method = choice("method", v.get("method"), DEFAULTS["method"])
    kw: dict[str, Any] = {"method": method}
    if method == "qlora":  # the bits widget is shown for QLoRA only; the CLI rejects --bits elsewhere
        kw["bits"] = whole("bits", v.get("bits"))
    if method in ("lora", "qlora"):
        kw["rank"] = whole("rank", v.get("rank"))
        targets = choice("targets", v.get("targets"), AUTO)
        if targets != AUTO:
            kw["targets"] = targets
    for name in ("precision", "optimizer", "attn", "loss"):
        val = choice(name, v.get(name), AUTO)
        if val != AUTO:
            kw[name] = val
    gc = choice("gradient_checkpointing", v.get("gradient_checkpointing"), AUTO)
    if gc != AUTO:
        kw["gradient_checkpointing"] = gc == "on"
    for name in ("batch", "seq", "grad_accum", "gpus", "nodes"):
        kw[name] = whole(name, v.get(name))
    kw["zero"] = whole("zero", v.get("zero", "0"), minimum=0)
    kw["fsdp"] = bool(v.get("fsdp"))
    kw["offload"] = choice("offload", v.get("offload"), "none")
    kw["framework"] = choice("framework", v.get("framework"), DEFAULTS["framework"])
    for name in ("compile", "activation_offload"):
        if v.get(name):
            kw[name] = True
    labels = v.get("num_labels")
    if not _blank(labels):
        kw["num_labels"] = whole("num_labels", labels)
    for f in GENERATED:
        if f.applies_to(method):
            kw.update(widget_value(f, v.get(f.name)))
    return kw


def widget_value(f: field_table.Field, value: Any) -> dict[str, Any]:
    """``{field: value}`` from a generated widget, as the CLI's flag would pass it; ``{}`` where the widget
    says "the default" (an empty box, ``AUTO``, a switch left as it was). Raises TuneplanError."""
    kind = widget_kind(f)
    if kind == "checkbox":
        return {} if bool(value) == bool(f.default) else {f.name: bool(value)}
    if kind in ("dropdown", "radio"):
        picked = choice(f.name, value, widget_default(f))
        if picked == AUTO or picked == widget_default(f):
            return {}
        return {f.name: whole(f.name, picked, minimum=0) if f.type is int else picked}
    if _blank(value):
        return {}
    if f.type is int:
        return {f.name: whole(f.name, value, minimum=0)}
    if f.type is float:
        return {f.name: _number(f.name, value, str(f.accepted or "a number"))}
    return {f.name: choice(f.name, value, "")}


# Resolved once per name or text (a Hub id costs a network round trip; every field change re-reads the
# form); failures are not cached. The pasted-text cache holds at most 8 x PASTE_MAX_BYTES of text.
_named_model = lru_cache(maxsize=64)(sources.resolve_name)
_pasted_model = lru_cache(maxsize=8)(sources.model_from_text)


def read_model(name: str | None, config_text: str | None) -> tuple[ModelSpec, list[str]]:
    """The model: a pasted/uploaded config.json wins over the name. Raises TuneplanError (field model).

    Only catalog names, public Hugging Face ids (fetched anonymously) and text the user sent are read
    (``tuneplan.web.sources``): never a path on the server.
    """
    text = config_text.strip() if isinstance(config_text, str) else ""
    if text:
        spec, notes = _pasted_model(text)
    else:
        spec, notes = _named_model(name if isinstance(name, str) else "")
    return spec, list(notes)


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def read_gpu(name: Any) -> Accelerator | None:
    return read_gpu_named(name)[0]


def read_gpu_named(name: Any) -> tuple[Accelerator | None, str | None]:
    """The card and, when the typed name also names another board of the same memory, the choice made
    (``resolve_named``: the CLI's rule; a name that leaves the memory open is refused)."""
    from tuneplan.catalog.accelerators import resolve_named

    name = choice("gpu", name, "")
    return resolve_named(name) if name else (None, None)


def parse(values: dict[str, Any]) -> Parsed:
    """All the form's inputs at once, each group's error kept for its own message slot."""
    v = {**DEFAULTS, **values}
    p = Parsed()
    try:
        p.model, p.notes = read_model(v.get("model"), v.get("config_text"))
    except TuneplanError as exc:
        p.fail("model", page_error(exc))
    try:
        p.setup_kw = setup_kwargs(v)
        # The core's validation, the same the CLI runs; repeated with the model by build_setup later.
        TrainSetup(**p.setup_kw).validate()
    except TuneplanError as exc:
        p.fail(group_of(exc.field), page_error(exc))
    try:
        p.gpu, gpu_choice = read_gpu_named(v.get("gpu"))
        if gpu_choice:
            p.notes.append(f"card: {gpu_choice}")
    except TuneplanError as exc:
        p.fail("hardware", page_error(exc))
    try:
        p.samples = whole("samples", v.get("samples"))
        p.epochs = positive("epochs", v.get("epochs"), maximum=limits.EPOCHS_MAX,
                            accepted="a number > 0 (e.g. 1, 3, 0.5)")
        avg = v.get("avg_tokens")
        if not _blank(avg):
            p.avg_tokens = positive("avg_tokens", avg, maximum=limits.AVG_TOKENS_MAX,
                                    accepted="tokens per sample after the chat template, e.g. 350; "
                                    "empty: fills seq")
        p.packing = bool(v.get("packing"))
    except TuneplanError as exc:
        p.fail("dataset", page_error(exc))
    return p
