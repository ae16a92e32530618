"""The rules' data and what predicates share: the rules file, version parsing, the check's Context.

Rules are data (``tuneplan/catalog/compat_rules.toml``: level, message, fix, source, numbers) plus one
small predicate each (``predicates/``, a module per kind of rule); ``tuneplan.compat.check`` joins them.
Pure: no I/O beyond reading the packaged rules file once, no printing.

The ``versions`` keys a Context reads are listed in ``tuneplan.compat``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from importlib import resources
from typing import Any

from tuneplan.specs.hardware import Accelerator, parse_cc
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the tomli backport has the same API
    import tomli as tomllib

LEVELS = ("error", "warning", "info")
# Optimizers that are bitsandbytes classes under every framework profile (adamw_bnb_8bit,
# paged_adamw_8bit, paged_adamw_32bit in transformers' OptimizerNames; Unsloth's adamw_8bit).
BNB_OPTIMIZERS = ("adamw-8bit", "paged-adamw-8bit", "paged-adamw")


@dataclass(frozen=True)
class Rule:
    code: str
    level: str
    message: str
    fix: str
    source: str
    params: dict[str, Any] = field(default_factory=dict)
    level_unknown: str | None = None
    message_unknown: str | None = None
    fix_unknown: str | None = None
    # A breakage known for some library versions: what it runs only with, when the versions are not
    # given (the estimate's verdict), and the floors an exported recipe pins and checks.
    requires: str | None = None
    pin: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Capability:
    """Whether a card can do one thing: ``ok`` True / False / None (unknown), with why and source."""

    name: str
    label: str
    ok: bool | None
    why: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "label": self.label, "ok": self.ok, "why": self.why, "source": self.source}


@lru_cache(maxsize=1)
def rules_data() -> dict[str, Any]:
    text = resources.files("tuneplan.catalog").joinpath("compat_rules.toml").read_text(encoding="utf-8")
    data: dict[str, Any] = tomllib.loads(text)
    return data


@lru_cache(maxsize=1)
def rules() -> tuple[Rule, ...]:
    return tuple(Rule(**{k: v for k, v in r.items()}) for r in rules_data()["rule"])


def rule(code: str) -> Rule:
    for r in rules():
        if r.code == code:
            return r
    raise KeyError(code)


# ---- versions ----------------------------------------------------------------------------------


def vtuple(v: str | None) -> tuple[int, ...] | None:
    """'2.10.0+cu128' -> (2, 10, 0); '0.45.3' -> (0, 45, 3); '12.8' -> (12, 8, 0); None/garbage -> None."""
    if not v:
        return None
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(v))
    if not m:
        return None
    parts = tuple(int(x) for x in m.group(1).split("."))
    return (parts + (0, 0, 0))[:3] if len(parts) < 3 else parts[:3]


def rule_version(text: str) -> tuple[int, ...]:
    """A version written in the rules file ('0.47.0'): always parses (a bad rules file is a bug)."""
    v = vtuple(text)
    if v is None:
        raise ValueError(f"compat_rules.toml: {text!r} is not a version")
    return v


def rule_cc(text: Any) -> tuple[int, int]:
    """A compute capability written in the rules file ('7.5'): always parses."""
    cc = parse_cc(text)
    if cc is None:
        raise ValueError(f"compat_rules.toml: {text!r} is not a compute capability")
    return cc


def arch_covered(cc: tuple[int, int], arch_list: list[str]) -> bool:
    """Does a build with these targets run on a device of compute capability ``cc``?

    A cubin built for sm_Xy runs on X.z with z >= y (same major); PTX (compute_XY) JIT-compiles for any
    device at or above XY.
    """
    for a in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+?)(\d)a?", a.strip().lower())
        if not m:
            continue
        major, minor = int(m.group(2)), int(m.group(3))
        if m.group(1) == "sm" and major == cc[0] and minor <= cc[1]:
            return True
        if m.group(1) == "compute" and (major, minor) <= cc:
            return True
    return False


def table_arch_list(torch_version: str | None, torch_cuda: str | None) -> list[str] | None:
    """The arch list of an official wheel from compat_rules.toml [[torch_build]], or None if not tabled."""
    tv, cv = vtuple(torch_version), vtuple(torch_cuda)
    if tv is None or cv is None:
        return None
    for b in rules_data().get("torch_build", []):
        lo, hi = rule_version(b["torch"][0]), rule_version(b["torch"][1])
        if rule_version(b["cuda"])[:2] == cv[:2] and lo[:2] <= tv[:2] <= hi[:2]:
            archs = ["sm_" + a.replace(".", "") for a in b["archs"]]
            if b.get("ptx"):
                archs.append("compute_" + b["ptx"].replace(".", ""))
            return archs
    return None


# ---- capabilities ---------------------------------------------------------------------------------


def _capability(name: str, spec: dict[str, Any], acc: Accelerator) -> Capability:
    label, source = spec.get("label", name), spec.get("source", "")
    plat = acc.platform
    if plat == "cuda":
        cc = acc.compute_capability
        if cc is None:
            return Capability(name, label, None, "compute capability unknown", source)
        lo, hi = parse_cc(spec.get("cuda_min")), parse_cc(spec.get("cuda_max"))
        if lo and cc < lo:
            return Capability(name, label, False, f"needs compute capability >= {lo[0]}.{lo[1]}", source)
        if hi and cc > hi:
            if spec.get("cuda_unverified_above"):
                return Capability(name, label, None, f"verified up to {hi[0]}.{hi[1]} only", source)
            return Capability(name, label, False, f"covers compute capability <= {hi[0]}.{hi[1]}", source)
        rng = f"{lo[0]}.{lo[1]}" if lo else "any"
        return Capability(name, label, True, f"compute capability {acc.cc_str} (needs >= {rng})", source)
    if plat in ("rocm", "npu"):
        table, target = spec.get(plat) or {}, acc.arch_target
        for status, ok in (("yes", True), ("no", False), ("unknown", None)):
            if target in table.get(status, []):
                return Capability(name, label, ok, f"{target}: {status}", source)
        return Capability(name, label, None, f"{target or plat}: not covered by the sources", source)
    return Capability(name, label, None, f"vendor {acc.vendor!r}: no rules", source)


def capabilities(acc: Accelerator) -> list[Capability]:
    """Every capability in the rules file for this card (hardware facts; versions are for ``check``)."""
    return list(_capabilities(acc))


@lru_cache(maxsize=1024)
def _capabilities(acc: Accelerator) -> tuple[Capability, ...]:  # Accelerator is frozen: hashable
    return tuple(_capability(n, spec, acc) for n, spec in rules_data()["capability"].items())


@lru_cache(maxsize=1024)
def _capability_oks(acc: Accelerator) -> dict[str, bool | None]:
    """Each capability's verdict on the card, by name: made once per card (every setup's check reads it),
    read only."""
    return {c.name: c.ok for c in _capabilities(acc)}


# ---- the context a predicate sees -----------------------------------------------------------------


@dataclass
class Context:
    acc: Accelerator | None
    setup: TrainSetup
    model: ModelSpec | None
    versions: dict[str, Any] | None

    @property
    def platform(self) -> str | None:
        return self.acc.platform if self.acc else None

    @property
    def card(self) -> Accelerator:
        """The accelerator, for predicates that run once the platform or a capability says there is one."""
        if self.acc is None:
            raise ValueError("this compatibility rule needs an accelerator")
        return self.acc

    @property
    def cc(self) -> tuple[int, int] | None:
        return self.acc.compute_capability if self.acc else None

    @cached_property
    def _caps(self) -> dict[str, bool | None]:
        if self.acc is None:
            return {}
        return _capability_oks(self.acc)

    def cap(self, name: str) -> bool | None:
        return self._caps.get(name)

    @property
    def known(self) -> bool:
        """Library versions were given (doctor): absent keys then mean 'not installed'."""
        return self.versions is not None

    def raw(self, lib: str) -> Any:
        return (self.versions or {}).get(lib)

    def ver(self, lib: str) -> tuple[int, ...] | None:
        return vtuple(self.raw(lib))

    @property
    def uses_bnb(self) -> bool:
        return self.setup.method == "qlora" or self.setup.optimizer in BNB_OPTIMIZERS

    def base_vars(self) -> dict[str, Any]:
        a, s = self.acc, self.setup
        if a is None:
            arch = "no accelerator"
        elif a.platform == "cuda":
            arch = f"compute capability {a.cc_str}" if a.cc_str else "compute capability unknown"
        else:
            arch = a.arch_target or a.compute_target or "unknown target"
        return {
            "acc": a.name if a else "this setup",
            "cc": (a.cc_str or arch) if a else "n/a",
            "arch": arch,
            "method": s.method,
            "precision": s.precision,
            "attn": s.attn,
            "optimizer": s.optimizer,
            "bits": s.quant_bits,
            "framework": s.framework,
            "model": self.model.name if self.model else "the model",
        }


def torch_install_hint(acc: Accelerator | None, versions: dict[str, Any] | None) -> str:
    """The PyTorch install command for this card and driver (compat_rules.toml [torch_install])."""
    ti: dict[str, str] = rules_data()["torch_install"]
    if acc is None:
        return ti["current"]
    if acc.platform == "npu":
        return ti["npu"]
    if acc.platform == "rocm":
        return ti["rocm"]
    cc = acc.compute_capability
    if cc is not None and cc < (7, 5):
        return ti["legacy"]
    driver = vtuple((versions or {}).get("driver"))
    if driver is not None and driver[0] < int(ti["driver_for_cu13"]):
        return ti["blackwell_old_driver"] if cc is not None and cc >= (10, 0) else ti["old_driver"]
    return ti["current"]
