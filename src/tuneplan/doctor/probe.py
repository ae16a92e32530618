"""What `tuneplan doctor` detects about a machine, and the interface detection sits behind.

``Probe.detect() -> MachineInfo``. The real probe (:class:`tuneplan.doctor.system.SystemProbe`) asks
NVML / nvidia-smi / npu-smi / torch; tests and ``tuneplan doctor --machine FILE`` use
:class:`StaticProbe` with a ``MachineInfo`` built from a dict (the ``machine`` section of a previous
``tuneplan doctor --json``), so a report can be re-diagnosed on another computer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuneplan.errors import TuneplanError
from tuneplan.specs.hardware import parse_cc

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
        d["compute_capability"] = ".".join(map(str, self.compute_capability)) if self.compute_capability else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "device") -> Device:
        if not isinstance(d, dict) or "name" not in d:
            raise TuneplanError(f"{where}: expected a mapping with at least `name`", field="machine")
        kind = d.get("kind", "cuda")
        if kind not in DEVICE_KINDS:
            raise TuneplanError(f"{where}.kind: unknown value {kind!r}", field="machine", accepted=DEVICE_KINDS)
        cc = d.get("compute_capability")
        parsed = parse_cc(str(cc) if isinstance(cc, (int, float)) else cc)
        if cc is not None and parsed is None:
            raise TuneplanError(f"{where}.compute_capability: expected \"X.Y\", got {cc!r}", field="machine")
        return cls(index=int(d.get("index", 0)), kind=kind, name=str(d["name"]),
                   memory_total_bytes=_opt_int(d.get("memory_total_bytes")),
                   memory_free_bytes=_opt_int(d.get("memory_free_bytes")),
                   compute_capability=parsed, arch_target=d.get("arch_target"))


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


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
            raise TuneplanError("expected a mapping (the `machine` section of `tuneplan doctor --json`)",
                                field="machine")
        unknown = sorted(set(d) - {"devices", "driver_version", "cuda_driver_version", "versions", "notes", "platform"})
        if unknown:
            raise TuneplanError(f"unknown key(s) {unknown}", field="machine",
                                accepted="devices, driver_version, cuda_driver_version, versions, notes, platform")
        devices = [Device.from_dict(x, f"devices[{i}]") for i, x in enumerate(d.get("devices") or [])]
        versions = d.get("versions") or {}
        if not isinstance(versions, dict):
            raise TuneplanError("versions: expected a mapping of library -> version", field="machine")
        return cls(devices=devices, driver_version=d.get("driver_version"),
                   cuda_driver_version=d.get("cuda_driver_version"), versions=dict(versions),
                   notes=list(d.get("notes") or []), platform=dict(d.get("platform") or {}))


class Probe(Protocol):
    def detect(self) -> MachineInfo: ...


class StaticProbe:
    """A probe that returns a fixed MachineInfo (tests; `--machine FILE`)."""

    def __init__(self, machine: MachineInfo) -> None:
        self.machine = machine

    def detect(self) -> MachineInfo:
        return self.machine

    @classmethod
    def from_file(cls, path: str | Path) -> StaticProbe:
        import yaml  # a dependency; its safe loader reads JSON too

        p = Path(path).expanduser()
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise TuneplanError(f"cannot read {p}: {exc.strerror or exc}", field="machine") from None
        except yaml.YAMLError as exc:
            raise TuneplanError(f"{p}: not valid JSON/YAML: {exc}", field="machine") from None
        return cls(MachineInfo.from_dict(data))
