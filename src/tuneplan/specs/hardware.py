"""Accelerator: one card as the planner needs it. Facts come from the catalog; unknowns stay None."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3
# When no usable figure was observed, the memory PyTorch can see is the marketed capacity in GiB
# less what the driver reserves. Observed ratios in gpus.csv: A100-80GB 79.21/80, H100 79.65/80,
# A100-40GB 39.49/40, H200 140.40/141: 0.990-0.996. We take the lowest (0.99) and say it is derived.
USABLE_FRACTION = 0.99


@dataclass(frozen=True)
class Accelerator:
    id: str
    name: str
    vendor: str
    memory_gb_marketed: float | None
    memory_gib_usable_observed: float | None = None
    compute_capability: tuple[int, int] | None = None
    compute_target: str | None = None
    bf16_tflops_dense: float | None = None
    fp16_fp16acc_tflops_dense: float | None = None
    fp8_tflops_dense: float | None = None
    fp32_tflops: float | None = None
    memory_bandwidth_gbs: float | None = None
    bf16_support: str | None = None
    fp8_support: str | None = None
    tensor_cores: str | None = None
    interconnect: str | None = None
    memory_type: str | None = None
    tdp_w: float | None = None
    release_year: int | None = None
    launch_price_usd: float | None = None
    cloud_usd_per_gpu_hr: float | None = None
    price_basis_and_date: str | None = None
    architecture: str | None = None
    form_factor: str | None = None
    source: str = ""
    verified: str = ""
    unverified_or_derived_fields: str | None = None
    notes: str | None = None
    aliases: tuple[str, ...] = field(default=(), compare=False)

    @property
    def memory_bytes(self) -> int:
        """Memory as the software sees it (torch total_memory)."""
        if self.memory_gib_usable_observed:
            return int(self.memory_gib_usable_observed * GIB)
        if self.memory_gb_marketed:
            return int(self.memory_gb_marketed * GIB * USABLE_FRACTION)
        return 0

    @property
    def memory_is_observed(self) -> bool:
        return bool(self.memory_gib_usable_observed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "vendor": self.vendor,
            "memory_bytes": self.memory_bytes,
            "memory_source": "observed" if self.memory_is_observed else f"derived: marketed GiB x {USABLE_FRACTION}",
            "compute_capability": ".".join(map(str, self.compute_capability)) if self.compute_capability else None,
            "bf16_tflops_dense": self.bf16_tflops_dense,
            "memory_bandwidth_gbs": self.memory_bandwidth_gbs,
            "cloud_usd_per_gpu_hr": self.cloud_usd_per_gpu_hr,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Accelerator:
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in known}
        cc = kw.get("compute_capability")
        if isinstance(cc, (list, tuple)) and len(cc) == 2:
            kw["compute_capability"] = (int(cc[0]), int(cc[1]))
        elif isinstance(cc, str) and "." in cc:
            a, b = cc.split(".", 1)
            kw["compute_capability"] = (int(a), int(b)) if a.isdigit() and b.isdigit() else None
        if "aliases" in kw:
            kw["aliases"] = tuple(kw["aliases"])
        return cls(**kw)
