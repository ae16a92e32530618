"""Accelerator: one card as the planner needs it. Facts come from the catalog; unknowns stay None.

One ``Accelerator`` is one device as the software sees it (one ``torch.cuda`` / ``torch.npu`` device).
Where a package holds several devices (MI250X: two GCDs), the catalog keeps the vendor's per-package
figures and ``devices_per_package`` says how to split them (compat.md section 6).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

GIB = 1024**3
# When no usable figure was observed, the memory PyTorch can see is the marketed capacity in GiB
# less what the driver reserves. Observed ratios in gpus.csv: A100-80GB 79.21/80, H100 79.65/80,
# A100-40GB 39.49/40, H200 140.40/141: 0.990-0.996. We take the lowest (0.99) and say it is derived.
USABLE_FRACTION = 0.99

# Software stack by vendor: which runtime a card's PyTorch goes through (compat.md sections 4-6).
PLATFORMS = {"nvidia": "cuda", "amd": "rocm", "huawei": "npu"}


def _yes_no(text: str | None) -> bool | None:
    """gpus.csv support columns read 'yes (...)' / 'no (...)'; anything else is unknown."""
    if not text:
        return None
    t = text.strip().lower()
    if t.startswith("yes"):
        return True
    if t.startswith("no"):
        return False
    return None


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
    int8_tops_dense: float | None = None
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
    cloud_price_date: str | None = None  # YYYY-MM-DD of the reading, "undated", or None (no price)
    price_basis_and_date: str | None = None
    architecture: str | None = None
    form_factor: str | None = None
    devices_per_package: int = 1
    source: str = ""
    verified: str = ""
    unverified_or_derived_fields: str | None = None
    notes: str | None = None
    origin: str = "catalog"  # "catalog", or the user hardware file that added / overrode it
    aliases: tuple[str, ...] = field(default=(), compare=False)

    # ---- memory ------------------------------------------------------------------------------
    @property
    def memory_bytes(self) -> int:
        """Memory of one device as the software sees it (torch total_memory / npu-smi HBM total)."""
        if self.memory_gib_usable_observed:
            return int(self.memory_gib_usable_observed * GIB)
        if self.memory_gb_marketed:
            per_device = self.memory_gb_marketed / max(1, self.devices_per_package)
            return int(per_device * GIB * USABLE_FRACTION)
        return 0

    @property
    def memory_is_observed(self) -> bool:
        return bool(self.memory_gib_usable_observed)

    @property
    def memory_source(self) -> str:
        if self.memory_is_observed:
            return "observed"
        if not self.memory_gb_marketed:
            return "unknown"
        split = f" / {self.devices_per_package} devices per package" if self.devices_per_package > 1 else ""
        return f"derived: marketed GiB{split} x {USABLE_FRACTION}"

    # ---- what the compatibility rules key on ------------------------------------------------
    @cached_property
    def platform(self) -> str:
        """'cuda' | 'rocm' | 'npu' | 'unknown': the PyTorch backend this card runs through (kept on the
        card: the compatibility rules ask about ten times per estimate)."""
        return PLATFORMS.get(self.vendor.strip().lower(), "unknown")

    @property
    def outside_torch_words(self) -> tuple[str, str]:
        """The names of the memory outside PyTorch on this platform: the device runtime's context and the
        collectives library's buffers (NCCL on CUDA; RCCL, its ROCm port; HCCL through torch_npu)."""
        return {"rocm": ("device runtime", "RCCL"), "npu": ("device runtime", "HCCL")}.get(
            self.platform, ("CUDA context", "NCCL"))

    @property
    def cc_str(self) -> str | None:
        return ".".join(map(str, self.compute_capability)) if self.compute_capability else None

    @property
    def arch_target(self) -> str | None:
        """AMD LLVM target ('gfx942') or Ascend SoC family ('ascend910b'); None for NVIDIA/unknown."""
        if self.platform == "rocm":
            m = re.search(r"gfx[0-9a-f]+", (self.compute_target or "").lower())
            return m.group(0) if m else None
        if self.platform == "npu":
            m = re.search(r"910\s*([ab])", f"{self.name} {self.id} {self.compute_target or ''}".lower())
            return f"ascend910{m.group(1)}" if m else None
        return None

    @property
    def supports_bf16(self) -> bool | None:
        return _yes_no(self.bf16_support)

    @property
    def supports_fp8(self) -> bool | None:
        return _yes_no(self.fp8_support)

    @property
    def has_tensor_cores(self) -> bool | None:
        return _yes_no(self.tensor_cores)

    @property
    def has_fast_link(self) -> bool | None:
        """A GPU-to-GPU link faster than PCIe (NVLink, Infinity Fabric, HCCS), from the interconnect text."""
        text = (self.interconnect or "").lower()
        if not text:
            return None
        if "no nvlink" in text:
            return False
        if any(k in text for k in ("nvlink", "infinity fabric", "hccs")):
            return True
        return False if "pcie" in text else None

    # ---- (de)serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        d["compute_capability"] = self.cc_str
        d["aliases"] = list(self.aliases)
        d.update({
            "memory_bytes": self.memory_bytes,
            "memory_gib": round(self.memory_bytes / GIB, 2),
            "memory_source": self.memory_source,
            "platform": self.platform,
        })
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Accelerator:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["compute_capability"] = parse_cc(kw.get("compute_capability"))
        if "aliases" in kw:
            kw["aliases"] = tuple(kw["aliases"] or ())
        if kw.get("devices_per_package") is None:
            kw.pop("devices_per_package", None)
        return cls(**kw)


def parse_cc(cc: Any) -> tuple[int, int] | None:
    """'8.9', [8, 9], (8, 9) -> (8, 9); anything else (gfx targets, 'n/a', None) -> None."""
    if isinstance(cc, (list, tuple)) and len(cc) == 2:
        return (int(cc[0]), int(cc[1]))
    if isinstance(cc, str):
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", cc)
        return (int(m.group(1)), int(m.group(2))) if m else None
    return None
