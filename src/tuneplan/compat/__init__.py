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

__all__ = ["BNB_OPTIMIZERS", "LEVELS", "PREDICATES", "Capability", "Context", "Rule", "arch_covered",
           "capabilities", "check", "rule", "rules", "table_arch_list", "torch_install_hint", "vtuple"]


def check(acc: Accelerator | None, setup: TrainSetup, model: ModelSpec | None,
          versions: dict[str, Any] | None = None) -> list[Finding]:
    """Findings for running ``setup`` of ``model`` on ``acc``, errors first.

    ``acc`` None: setup-only findings. ``model`` None: rules that need the architecture are skipped.
    ``versions`` None: version-independent rules, and version-dependent ones phrased as "versions X-Y
    are affected"; a dict (doctor): definite answers for the installed libraries.
    """
    ctx = Context(acc, setup, model, versions)
    base = ctx.base_vars()
    out: list[Finding] = []
    for r in rules():
        hit = PREDICATES[r.code](ctx, r.params)
        if hit is None:
            continue
        unknown = bool(hit.pop("_unknown", False))
        values = {**base, **hit}
        level = (r.level_unknown or r.level) if unknown else r.level
        message = (r.message_unknown or r.message) if unknown else r.message
        fix = (r.fix_unknown or r.fix) if unknown else r.fix
        out.append(Finding(level, r.code, message.format_map(values), fix.format_map(values), r.source))
    return sorted(out, key=lambda f: LEVELS.index(f.level))
