"""A finding about a setup: what will not run, or run badly, and what to do about it.

The compatibility rules (``tuneplan.compat``), the estimator (a device map that spills to the CPU) and
``doctor`` make them; every face shows them. It sits with the specs, below all of them, so that no
package imports one above it to name a finding.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Finding:
    """A compatibility or plausibility finding, with what to do about it."""

    level: str  # "error" | "warning" | "info"
    code: str
    message: str
    fix: str = ""
    source: str = ""
    # A known breakage whose library versions were not given: the condition it runs under ("bitsandbytes
    # >= 0.47.0 or a CUDA 12.6 PyTorch"), which the verdict then states (``Estimate.verdict``).
    requires: str = ""

    def to_dict(self) -> dict[str, str]:
        d = asdict(self)
        if not self.requires:
            del d["requires"]
        return d
