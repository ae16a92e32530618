"""The safety margin a recommendation keeps below the card's usable memory.

The estimate's device peak is a central figure; its bands say how far the real one may be above it
(``Estimate.breakdown.bands``: "reserved" = the caching allocator's reserved peak, with activation and
fragmentation uncertainty; "cuda_context" = driver, CUDA version, lazy loading). The upper band of the
device peak is

    device_peak_high = bands["reserved"].high + bands["cuda_context"].high + nccl_bytes

(the same sum as ``MemoryBreakdown.device_peak_bytes`` = reserved + context + NCCL, with each term at
its high end; NCCL has no band): the breakdown carries it (``MemoryBreakdown.device_peak_high_bytes``), and
a grid's arrays get it from ``estimator.overhead.device_peak_high``.

The margin the user chooses (``--margin``):
- ``band`` (default): the upper band must fit the usable memory;
- ``N GiB`` / ``N%``: the central device peak plus N GiB (or N % of the usable memory) must fit;
- ``0``: the central figure only, as ``Estimate.fits`` judges it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.estimator.overhead import device_peak_high as upper_band
from tuneplan.estimator.types import GIB

ACCEPTED = ("band (the estimate's upper band, default), a size in GiB such as 2GiB, a percentage such as "
            "10%, or 0")


@dataclass(frozen=True)
class Margin:
    kind: str  # "band" | "bytes" | "fraction"
    value: float = 0.0

    def describe(self) -> str:
        if self.kind == "band":
            return ("the upper band of the device peak (reserved high + CUDA context high) fits the usable "
                    "memory")
        if self.kind == "bytes":
            return f"device peak + {self.value / GIB:g} GiB fits the usable memory"
        return f"device peak + {self.value * 100:g} % of the usable memory fits it"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "rule": self.describe()}


BAND = Margin("band")


def parse_margin(text: str | Margin | None) -> Margin:
    """``band`` | ``2GiB`` | ``2`` (GiB) | ``10%`` | ``0`` -> Margin."""
    if text is None:
        return BAND
    if isinstance(text, Margin):
        return text
    s = str(text).strip().lower().replace(" ", "")
    if s in ("band", "auto", ""):
        return BAND
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(%|gib|g)?", s)
    if not m:
        raise TuneplanError(f"cannot read {text!r}", field="margin", accepted=ACCEPTED)
    v, unit = float(m.group(1)), m.group(2)
    if unit == "%":
        if v >= 100:
            raise TuneplanError(f"{text!r} leaves no memory", field="margin", accepted=ACCEPTED)
        return Margin("fraction", v / 100)
    return Margin("bytes", v * GIB)


__all__ = ["BAND", "Margin", "device_peak_high", "fits_with_margin", "parse_margin", "required",
           "required_bytes", "upper_band"]


def device_peak_high(est: Any) -> int:
    """Upper band of the device peak, as the estimate's breakdown carries it (module docstring)."""
    return int(est.breakdown.device_peak_high_bytes)


def required_bytes(est: Any, margin: Margin) -> int:
    """What must fit under the usable memory for ``est`` to count as fitting with ``margin``."""
    high = device_peak_high(est) if margin.kind == "band" else None
    return required(margin, est.breakdown.device_needed_bytes, high, est.gpu.memory_bytes)


def required(margin: Margin, device_needed: Any, device_peak_high: Any, memory: int) -> Any:
    """:func:`required_bytes` from the figures themselves (ints, or a grid's arrays element-wise):
    the upper band for ``band`` (the stranded segments kept: a safety margin), else what the card must
    hold (``MemoryBreakdown.device_needed_bytes``) plus the margin's bytes."""
    if margin.kind == "band":
        return device_peak_high
    if margin.kind == "bytes":
        return device_needed + int(margin.value)
    return device_needed + int(margin.value * memory)


def fits_with_margin(est: Any, margin: Margin) -> bool:
    """The estimate fits (no error finding, central peak within memory) and keeps the margin."""
    return bool(est is not None and est.fits and required_bytes(est, margin) <= est.gpu.memory_bytes)
