"""Compatibility rules: will this setup run on this accelerator at all?

Each rule is a small predicate over (accelerator, setup, model) returning findings with a fix and a
source. Facts: ../shared/reference/compat.md (copied sources in each rule's ``source``).
"""

from __future__ import annotations

from tuneplan.estimator.types import Finding
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def check(acc: Accelerator | None, setup: TrainSetup, model: ModelSpec) -> list[Finding]:
    """Findings for running ``setup`` of ``model`` on ``acc`` (setup-only findings when acc is None)."""
    out: list[Finding] = []
    if acc is None:
        return out
    cc = acc.compute_capability
    if acc.vendor == "NVIDIA" and cc is not None and cc < (8, 0) and setup.precision in ("bf16", "bf16-mixed"):
        out.append(Finding(
            "error", "bf16-unsupported",
            f"{acc.name} (compute capability {cc[0]}.{cc[1]}) has no bf16 support; bf16 needs >= 8.0",
            "use --precision fp16-mixed (loss scaling) or fp32",
            "compat.md section 3.1; torch.cuda.is_bf16_supported"))
    return out
