"""Compatibility: will this setup run on this accelerator, with these libraries, at all?

``check`` applies every rule (``rules.py``: the data in ``catalog/compat_rules.toml``; ``predicates/``:
one small predicate per rule) to (accelerator, setup, model) and, when ``versions`` is given
(``tuneplan doctor``), to the installed libraries too. Without versions the version-dependent rules say
which versions are affected instead. Imports run one way: ``rules`` <- ``predicates`` <- this module.

``versions`` keys (all optional; a key that is absent or None means "not installed" once a dict is
given): ``torch`` ("2.10.0+cu128"), ``torch_cuda`` ("12.8"), ``torch_hip``, ``torch_arch_list``
(["sm_75", ...]), ``bitsandbytes``, ``bitsandbytes_import_error``, ``peft``, ``transformers``,
``accelerate``, ``deepspeed``, ``flash_attn``, ``flash_attn_3``, ``torch_npu``, ``driver``
("580.65.06"), ``cuda_driver`` ("13.0", the newest CUDA the driver supports).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tuneplan.compat.predicates import PREDICATES
from tuneplan.compat.rules import (
    BNB_OPTIMIZERS,
    LEVELS,
    Capability,
    Context,
    Rule,
    arch_covered,
    capabilities,
    rule,
    rules,
    table_arch_list,
    torch_install_hint,
    vtuple,
)
from tuneplan.specs.finding import Finding
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

__all__ = ["BNB_OPTIMIZERS", "LEVELS", "PREDICATES", "VERSION_KEYS", "Capability", "Context", "Rule",
           "arch_covered", "capabilities", "check", "parse_versions", "rule", "rules", "table_arch_list",
           "torch_install_hint", "version_floors", "vtuple"]

# The library versions a user may state (``estimate --versions``): the keys above that are a version.
VERSION_KEYS = ("torch", "torch_cuda", "torch_hip", "bitsandbytes", "peft", "transformers", "accelerate",
                "deepspeed", "flash_attn", "flash_attn_3", "torch_npu", "driver", "cuda_driver")


def parse_versions(text: str) -> dict[str, Any]:
    """``"bitsandbytes=0.48.1,torch=2.13.0+cu126"`` -> the ``versions`` dict ``check`` reads. A CUDA
    build suffix on torch (``+cu126``, PyTorch's local version label) gives ``torch_cuda`` when that is
    not stated. Libraries not named count as not installed."""
    from tuneplan.errors import TuneplanError

    accepted = "NAME=VERSION pairs, comma-separated; NAME one of " + ", ".join(VERSION_KEYS)
    out: dict[str, Any] = {}
    for item in (p.strip() for p in text.split(",")):
        name, eq, version = item.partition("=")
        name = name.strip().lower().replace("-", "_")
        if not eq or name not in VERSION_KEYS or vtuple(version) is None:
            raise TuneplanError(f"cannot read {item[:64]!r}", field="versions", accepted=accepted)
        out[name] = version.strip()
    cuda = out.get("torch", "").partition("+cu")[2]
    if cuda.isdigit() and len(cuda) >= 3 and "torch_cuda" not in out:
        out["torch_cuda"] = f"{cuda[:-1]}.{cuda[-1]}"  # cu126 -> 12.6
    return out


def check(acc: Accelerator | None, setup: TrainSetup, model: ModelSpec | None,
          versions: dict[str, Any] | None = None) -> list[Finding]:
    """Findings for running ``setup`` of ``model`` on ``acc``, errors first.

    ``acc`` None: setup-only findings. ``model`` None: rules that need the architecture are skipped.
    ``versions`` None: version-independent rules, and version-dependent ones phrased as "versions X-Y
    are affected" (a known breakage also says what it ``requires``); a dict (doctor, ``estimate
    --versions``): definite answers for the installed libraries.
    """
    ctx = Context(acc, setup, model, versions)
    base: dict[str, Any] | None = None  # the messages' common words, made at the first hit
    out: list[Finding] = []
    for r, applies in rule_predicates():
        hit = applies(ctx, r.params)
        if hit is None:
            continue
        if base is None:
            base = ctx.base_vars()
        unknown = bool(hit.pop("_unknown", False))
        values = {**base, **hit}
        level = (r.level_unknown or r.level) if unknown else r.level
        message = (r.message_unknown or r.message) if unknown else r.message
        fix = (r.fix_unknown or r.fix) if unknown else r.fix
        requires = r.requires.format_map(values) if unknown and r.requires else ""
        out.append(Finding(level, r.code, message.format_map(values), fix.format_map(values), r.source,
                           requires))
    return sorted(out, key=lambda f: LEVELS.index(f.level))


@lru_cache(maxsize=1)
def rule_predicates() -> tuple[tuple[Rule, Any], ...]:
    """Each rule with its predicate, paired once (every estimate runs them all)."""
    return tuple((r, PREDICATES[r.code]) for r in rules())


def version_floors(acc: Accelerator | None, setup: TrainSetup, model: ModelSpec | None) -> dict[str, str]:
    """The library floors a recipe for this setup pins and checks (``{"bitsandbytes": "0.47.0"}``): those
    of the known breakages that hit it on ``acc`` for some versions (the rules' ``pin``)."""
    floors: dict[str, str] = {}
    for f in check(acc, setup, model):
        if f.requires:
            floors.update(rule(f.code).pin)
    return floors
