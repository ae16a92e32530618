"""The setup fields, once: type, default, accepted values, unit, help, CLI flag, web label and widget, and
the names each field has in the files people train with.

Every ``TrainSetup`` field has one row here (a test holds the two together: same names, same defaults).
Faces are generated from the rows: ``cli/options.py`` builds the setup flags (name, help, metavar),
``web/wording.py`` the page's labels, ``ingest/common.py`` ``map_plain`` the plain part of every reader,
and ``export/common.py`` ``plain_keys`` the plain part of every writer.

A row names the field in LLaMA-Factory YAML, axolotl YAML, Hugging Face ``TrainingArguments`` / TRL
``SFTConfig`` + ``ModelConfig`` / PEFT ``LoraConfig`` / ``BitsAndBytesConfig`` ("transformers"),
DeepSpeed JSON and accelerate YAML, in two kinds:
- ``keys``: plain names. The value is the field's, unchanged (same meaning, a number, a switch or the same
  vocabulary); readers copy it, checked by the field's type, and writers write the first name (the others
  are older spellings a reader still accepts).
- ``via``: names (top-level, or inside the section named before them) that feed a hand-written
  translation in that format's reader or writer (``quantization_bit`` sets the method too, ``pure_bf16``
  the precision, optimizer names differ).
``methods`` limits a field to the methods it applies to (LoRA rank: lora, qlora): a reader reads its plain
keys only for those, a writer writes them only for those.

The rows live by idea: ``training`` (method, quantization, adapter, precision, optimizer), ``step``
(batch, length, accumulation, checkpointing, attention), ``parallel`` (GPUs, ZeRO / FSDP, offload, DeepSpeed
details), ``code_path`` (framework, kernels, head); ``field.py`` defines a row. ``FIELDS`` joins them in that
order, the order of ``--help``.

Adding a setup field: a row in its module, the field on ``TrainSetup``, the formula that reads it, its tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from tuneplan.specs.fields import code_path, parallel, step, training
from tuneplan.specs.fields.field import FORMATS, LORA, WIDGETS, Field, row

__all__ = ["BY_NAME", "FIELDS", "FORMATS", "LORA", "WIDGETS", "Field", "by_key", "cli_fields", "get",
           "plain_fields", "row", "web_labels"]

FIELDS: tuple[Field, ...] = (*training.ROWS, *step.ROWS, *parallel.ROWS, *code_path.ROWS)

BY_NAME: Mapping[str, Field] = MappingProxyType({f.name: f for f in FIELDS})


def get(name: str) -> Field:
    return BY_NAME[name]


def cli_fields() -> tuple[Field, ...]:
    """The rows that are CLI flags, in the table's order (the order of ``--help``)."""
    return tuple(f for f in FIELDS if f.flag)


def web_labels() -> dict[str, str]:
    """Field name -> the label the web page shows (rows that have a widget)."""
    return {f.name: f.label for f in FIELDS if f.label}


def by_key(fmt: str) -> dict[str, str]:
    """Plain keys of ``fmt`` -> field name: the keys whose value a reader copies into the field as is."""
    return {k: f.name for f in plain_fields(fmt) for k in f.keys[fmt]}


def plain_fields(fmt: str, method: str | None = "") -> tuple[Field, ...]:
    """The rows with plain keys in ``fmt``; with ``method`` given, those that apply to it."""
    if fmt not in FORMATS:
        raise KeyError(f"{fmt!r}: formats are {', '.join(FORMATS)}")
    return tuple(f for f in FIELDS if f.keys.get(fmt) and (method == "" or f.applies_to(method)))
