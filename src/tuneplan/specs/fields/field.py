"""One setup field's row: what the faces, readers and writers are generated from (``Field``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

FORMATS = ("llamafactory", "axolotl", "transformers", "deepspeed", "accelerate")
WIDGETS = ("radio", "dropdown", "number", "checkbox", "textbox", "none")


@dataclass(frozen=True)
class Field:
    """One setup field. ``accepted``: the values (a tuple) or a range in words; ``flag``: the CLI names
    (``()`` = not a flag: the DeepSpeed details read from a config)."""

    name: str
    type: type
    default: Any
    help: str
    accepted: tuple[Any, ...] | str = ""
    unit: str = ""
    flag: tuple[str, ...] = ()
    label: str = ""
    widget: str = "none"
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    via: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    methods: tuple[str, ...] = ()

    def names(self, fmt: str) -> tuple[str, ...]:
        """Every name of the field in ``fmt``: plain, then translated."""
        return (*self.keys.get(fmt, ()), *self.via.get(fmt, ()))

    def applies_to(self, method: str | None) -> bool:
        """The field means something for ``method`` (None: not known yet, so only the universal fields)."""
        return not self.methods or method in self.methods

    @property
    def is_switch(self) -> bool:
        return self.type is bool

    @property
    def metavar(self) -> str:
        """What the help shows after the flag: the field in capitals, ``N`` for counts, ``X`` for numbers."""
        if self.type is int:
            return "N"
        if self.type is float:
            return "X"
        return self.name.upper()

    def cli_help(self) -> str:
        accepted = " | ".join(map(str, self.accepted)) if isinstance(self.accepted, tuple) else self.accepted
        parts = [self.help]
        if accepted and not self.is_switch:
            parts.append(f"[{accepted}]")
        if self.unit:
            parts.append(f"({self.unit})")
        return " ".join(parts)


def row(name: str, type_: type, default: Any, help: str, **kw: Any) -> Field:
    keys, via = kw.pop("keys", {}), kw.pop("via", {})
    return Field(
        name, type_, default, help, keys=MappingProxyType(dict(keys)), via=MappingProxyType(dict(via)), **kw
    )


LORA = ("lora", "qlora")

