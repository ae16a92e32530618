"""What `tuneplan doctor` detects about a machine, and the interface detection sits behind.

``Detector.detect() -> MachineInfo``. The real detector (:class:`tuneplan.doctor.system.SystemDetector`) asks
NVML / nvidia-smi / npu-smi / torch; tests and ``tuneplan doctor --machine FILE`` use
:class:`StaticDetector` with a ``MachineInfo`` built from a dict (the ``machine`` section of a previous
``tuneplan doctor --json``), so a report can be re-diagnosed on another computer.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuneplan.errors import TuneplanError
from tuneplan.specs.hardware import parse_cc
from tuneplan.specs.limits import show_value

# Libraries doctor reports, in display order (keys of MachineInfo.versions; dist names in system.py).
LIBRARIES = ("torch", "bitsandbytes", "peft", "transformers", "accelerate", "deepspeed", "flash_attn",
             "flash_attn_3", "torch_npu", "triton", "nvidia-ml-py")
DEVICE_KINDS = ("cuda", "rocm", "npu")


@dataclass(frozen=True)
class Device:
    """One accelerator as the machine reports it."""

    index: int
    kind: str  # "cuda" | "rocm" | "npu"
    name: str
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None  # NVIDIA
    arch_target: str | None = None  # AMD gfx target / Ascend SoC name as reported

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        cc = self.compute_capability
        d["compute_capability"] = ".".join(map(str, cc)) if cc else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "device") -> Device:
        """A device record, every field checked for type and range (a machine file is user input)."""
        if not isinstance(d, dict) or "name" not in d:
            raise TuneplanError(f"{where}: expected a mapping with at least `name`", field="machine")
        kind = d.get("kind", "cuda")
        if not isinstance(kind, str) or kind not in DEVICE_KINDS:
            raise TuneplanError(f"{where}.kind: unknown value {show_value(kind)}", field="machine",
                                accepted=DEVICE_KINDS)
        cc = d.get("compute_capability")
        try:
            parsed = parse_cc(str(cc) if isinstance(cc, (int, float)) and not isinstance(cc, bool) else cc)
        except (TypeError, ValueError, OverflowError):
            parsed = None
        if cc is not None and (parsed is None or not all(0 <= x < 100 for x in parsed)):
            raise TuneplanError(f"{where}.compute_capability: expected \"X.Y\", got {show_value(cc)}",
                                field="machine", accepted="e.g. \"8.9\"")
        return cls(index=_int(d.get("index", 0), f"{where}.index", 0, MAX_DEVICE_INDEX) or 0, kind=kind,
                   name=_str(d["name"], f"{where}.name") or "",
                   memory_total_bytes=_int(d.get("memory_total_bytes"), f"{where}.memory_total_bytes", 0,
                                           MAX_BYTES),
                   memory_free_bytes=_int(d.get("memory_free_bytes"), f"{where}.memory_free_bytes", 0,
                                          MAX_BYTES),
                   compute_capability=parsed, arch_target=_str(d.get("arch_target"), f"{where}.arch_target"))


# A device index beyond 4,096 or a memory over 2^50 bytes (1 PiB; the largest card holds 288 GB) is no
# real machine's; a text field over 4,096 characters is no version string or card name.
MAX_DEVICE_INDEX = 4096
MAX_BYTES = 2**50
MAX_TEXT = 4096


def _int(v: Any, where: str, low: int, high: int) -> int | None:
    """None, or an integer in [low, high] (an integral finite float is accepted, as JSON writes them)."""
    if v is None:
        return None
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise TuneplanError(f"{where}: expected an integer in {low}..{high}, got {show_value(v)}",
                            field="machine")
    return v


def _version(v: Any, where: str) -> Any:
    """A detected library value: a version text, a flag, or a short list of texts (torch's arch list)."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, list):
        if len(v) > 256:
            raise TuneplanError(f"{where}: a list of {len(v)} items is no version record", field="machine")
        return [_str(x, where) for x in v]
    return _str(v, where)


def _str(v: Any, where: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, (str, int, float)) or isinstance(v, bool) or len(str(v)) > MAX_TEXT:
        raise TuneplanError(f"{where}: expected a short text, got {show_value(v)}", field="machine")
    return str(v)


# the keys of a MachineInfo dict (to_dict / the `machine` section of a doctor report)
MACHINE_KEYS = ("devices", "driver_version", "cuda_driver_version", "versions", "notes", "platform")

@dataclass
class MachineInfo:
    """Everything detected: devices, driver, library versions (None = not installed), notes."""

    devices: list[Device] = field(default_factory=list)
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # newest CUDA the driver supports
    versions: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # how detection went (NVML missing, ...)
    platform: dict[str, str] = field(default_factory=dict)  # python, os, machine

    def compat_versions(self) -> dict[str, Any]:
        """The ``versions`` dict that tuneplan.compat.check reads."""
        v = dict(self.versions)
        v["driver"] = self.driver_version
        v["cuda_driver"] = self.cuda_driver_version
        return v

    def to_dict(self) -> dict[str, Any]:
        return {"devices": [d.to_dict() for d in self.devices], "driver_version": self.driver_version,
                "cuda_driver_version": self.cuda_driver_version, "versions": dict(self.versions),
                "notes": list(self.notes), "platform": dict(self.platform)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MachineInfo:
        if isinstance(d, dict) and isinstance(d.get("machine"), dict):
            d = d["machine"]  # a whole `tuneplan doctor --json` report
        if not isinstance(d, dict):
            raise TuneplanError("expected a mapping (the `machine` section of a doctor report in JSON)",
                                field="machine")
        unknown = sorted(str(k)[:64] for k in set(d) - set(MACHINE_KEYS))
        if unknown:
            raise TuneplanError(f"unknown key(s) {unknown}", field="machine",
                                accepted=", ".join(MACHINE_KEYS))
        raw_devices = d.get("devices") or []
        if not isinstance(raw_devices, list) or len(raw_devices) > MAX_DEVICE_INDEX:
            raise TuneplanError("devices: expected a list of device records", field="machine")
        devices = [Device.from_dict(x, f"devices[{i}]") for i, x in enumerate(raw_devices)]
        versions = d.get("versions") or {}
        if not isinstance(versions, dict):
            raise TuneplanError("versions: expected a mapping of library -> version", field="machine")
        versions = {_str(k, "versions") or "": _version(v, f"versions.{str(k)[:64]}")
                    for k, v in versions.items()}
        notes = d.get("notes") or []
        if not isinstance(notes, list):
            raise TuneplanError("notes: expected a list of texts", field="machine")
        platform = d.get("platform") or {}
        if not isinstance(platform, dict):
            raise TuneplanError("platform: expected a mapping of texts", field="machine")
        return cls(devices=devices, driver_version=_str(d.get("driver_version"), "driver_version"),
                   cuda_driver_version=_str(d.get("cuda_driver_version"), "cuda_driver_version"),
                   versions=versions, notes=[_str(n, "notes") or "" for n in notes],
                   platform={_str(k, "platform") or "": _str(v, f"platform.{str(k)[:64]}") or ""
                             for k, v in platform.items()})


class Detector(Protocol):
    def detect(self) -> MachineInfo: ...


class StaticDetector:
    """A detector that returns a fixed MachineInfo (tests; `--machine FILE`)."""

    def __init__(self, machine: MachineInfo) -> None:
        self.machine = machine

    def detect(self) -> MachineInfo:
        return self.machine

    @classmethod
    def from_file(cls, path: str | Path) -> StaticDetector:
        from tuneplan.safe_read import parse_json, parse_yaml, read_text, user_path

        p = user_path(str(path), "machine")
        text = read_text(p, "machine", accepted="a JSON or YAML file (e.g. another box's `doctor --json`)")
        if p.suffix.lower() == ".json" or text.lstrip().startswith("{"):
            data = parse_json(text, "machine", str(p))
        else:  # YAML; its safe loader reads JSON too
            data = parse_yaml(text, "machine", str(p))[0]
        return cls(MachineInfo.from_dict(data))
