"""`compare`: two setups side by side, and which changed flag made the difference.

Setup A is the shared fields plus A's own, B the shared fields plus B's. The difference of the device
peak, B - A, is attributed to each changed field by changing that field alone, from A towards B
(``delta_bytes`` of one cause = peak(A with that field of B) - peak(A)), then all together. What the
single changes do not add up to is the interaction (for example a longer sequence costs more once
accumulation keeps gradients alive through the next forward). A single change that the setup
validation refuses on its own (ZeRO-3 without the second GPU that B also adds) has no figure and says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuneplan.api import Estimate, estimate
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.specs.model import ModelSpec

_UNSET = object()


@dataclass
class Cause:
    flag: str
    from_value: Any
    to_value: Any
    delta_bytes: int | None
    components: dict[str, int] = field(default_factory=dict)  # non-zero component changes
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"flag": self.flag, "from": self.from_value, "to": self.to_value,
                "delta_bytes": self.delta_bytes, "components": self.components, "error": self.error}


@dataclass
class Comparison:
    model: str
    a_fields: dict[str, Any]
    b_fields: dict[str, Any]
    a: Estimate
    b: Estimate
    causes: list[Cause]

    @property
    def delta_bytes(self) -> int:
        return self.b.breakdown.device_peak_bytes - self.a.breakdown.device_peak_bytes

    @property
    def interaction_bytes(self) -> int | None:
        parts = [c.delta_bytes for c in self.causes]
        known = [p for p in parts if p is not None]
        return None if len(known) < len(parts) else self.delta_bytes - sum(known)

    def components(self) -> list[dict[str, Any]]:
        """Per component: A, B and B - A (device totals last)."""
        ca, cb = self.a.breakdown.components, self.b.breakdown.components
        rows = [{"component": k, "a_bytes": ca.get(k, 0), "b_bytes": cb.get(k, 0),
                 "delta_bytes": cb.get(k, 0) - ca.get(k, 0)} for k in dict.fromkeys([*ca, *cb])]
        for name, f in (("allocated peak", "allocated_peak_bytes"), ("reserved peak", "reserved_peak_bytes"),
                        ("CUDA context", "cuda_context_bytes"), ("NCCL", "nccl_bytes"),
                        ("device peak", "device_peak_bytes")):
            va, vb = getattr(self.a.breakdown, f), getattr(self.b.breakdown, f)
            rows.append({"component": name, "a_bytes": va, "b_bytes": vb, "delta_bytes": vb - va})
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "a_fields": self.a_fields, "b_fields": self.b_fields,
                "a": self.a.to_dict(), "b": self.b.to_dict(), "components": self.components(),
                "delta_bytes": self.delta_bytes, "causes": [c.to_dict() for c in self.causes],
                "together_bytes": self.delta_bytes, "interaction_bytes": self.interaction_bytes}


def _estimate(model: ModelSpec, fields: Mapping[str, Any]) -> Estimate:
    f = dict(fields)
    return estimate(model, gpu=f.pop("gpu", None), timing=False, **f)


def compare(model: str | ModelSpec, shared: Mapping[str, Any], a: Mapping[str, Any],
            b: Mapping[str, Any]) -> Comparison:
    """Estimates of ``shared + a`` and ``shared + b`` (a ``gpu`` key names the card) and the causes."""
    spec = resolve_model(model) if isinstance(model, str) else model
    fa, fb = {**shared, **a}, {**shared, **b}
    ea = _estimate(spec, fa)  # the user's own input: errors go through, naming the field
    eb = _estimate(spec, fb)
    changed = [k for k in dict.fromkeys([*fa, *fb]) if fa.get(k, _UNSET) != fb.get(k, _UNSET)]
    causes = []
    for k in changed:
        one = {**fa}
        if k in fb:
            one[k] = fb[k]
        else:
            one.pop(k)
        cause = Cause(flag="--" + k.replace("_", "-"), from_value=fa.get(k), to_value=fb.get(k),
                      delta_bytes=None)
        try:
            e = _estimate(spec, one)
        except TuneplanError as exc:
            cause.error = str(exc)
        else:
            cause.delta_bytes = e.breakdown.device_peak_bytes - ea.breakdown.device_peak_bytes
            cause.components = {c: v - ea.breakdown.components.get(c, 0)
                                for c, v in e.breakdown.components.items()
                                if v != ea.breakdown.components.get(c, 0)}
        causes.append(cause)
    return Comparison(spec.name, fa, fb, ea, eb, causes)
