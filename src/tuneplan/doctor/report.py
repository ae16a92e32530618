"""`tuneplan doctor`: what will work on this machine, what will break, and the exact fix.

Pure over a :class:`MachineInfo`: each detected device is matched to the catalog (detected memory and
compute capability win over catalog figures), then the same compatibility rules ``estimate`` uses
(``tuneplan.compat.check``) run with the installed library versions for a short list of
things people try (LoRA, full fine-tuning, QLoRA 4/8-bit, 8-bit AdamW, FlashAttention-2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.compat import Capability, capabilities, check
from tuneplan.doctor.machine import Device, MachineInfo
from tuneplan.errors import TuneplanError
from tuneplan.specs.finding import Finding
from tuneplan.specs.hardware import GIB, Accelerator
from tuneplan.specs.setup import TrainSetup

VENDOR = {"cuda": "NVIDIA", "rocm": "AMD", "npu": "Huawei"}
# A catalog match is kept when the detected memory is within this fraction of the catalog figure
# (usable memory is 0.99-0.996 of marketed on the cards observed, specs/hardware.py); otherwise the
# detected card is a different SKU (e.g. 16 vs 32 GB) and stands on its own.
MEMORY_MATCH_TOLERANCE = 0.08
PIP = {"peft": "pip install peft", "transformers": "pip install transformers",
       "bitsandbytes": "pip install bitsandbytes",
       "flash_attn": "pip install flash-attn --no-build-isolation (FlashAttention README)"}
SHOWN_CAPABILITIES = ("tensor_cores", "bf16", "fp8", "flash_attn_2", "flash_attn_3", "bnb_4bit",
                      "bnb_llm_int8")


@dataclass(frozen=True)
class Task:
    key: str
    label: str
    setup: dict[str, Any]
    needs: tuple[str, ...]


TASKS = (
    Task("lora", "LoRA (PEFT), 16-bit mixed precision", {"method": "lora"},
         ("torch", "transformers", "peft")),
    Task("full", "full fine-tuning, 16-bit mixed precision", {"method": "full"}, ("torch", "transformers")),
    Task("qlora-4bit", "QLoRA 4-bit (bitsandbytes NF4)", {"method": "qlora", "bits": 4},
         ("torch", "transformers", "peft", "bitsandbytes")),
    Task("qlora-8bit", "QLoRA 8-bit (bitsandbytes LLM.int8)", {"method": "qlora", "bits": 8},
         ("torch", "transformers", "peft", "bitsandbytes")),
    # the next two on full fine-tuning, so a LoRA-only problem (peft-imports-bnb) is not repeated here
    Task("adamw-8bit", "8-bit AdamW (bitsandbytes)", {"method": "full", "optimizer": "adamw-8bit"},
         ("torch", "bitsandbytes")),
    Task("flash-attn-2", "FlashAttention-2 ({attn=flash})", {"method": "full", "attn": "flash"},
         ("torch", "transformers", "flash_attn")),
)


@dataclass
class TaskResult:
    key: str
    label: str
    status: str  # "works" | "works, with warnings" | "breaks" | "not installed"
    detail: str = ""
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "label": self.label, "status": self.status, "detail": self.detail,
                "fix": self.fix}


@dataclass
class DeviceReport:
    indices: list[int]
    device: Device
    accelerator: Accelerator
    matched: str  # catalog id, or "detected only"
    capabilities: list[Capability]
    tasks: list[TaskResult]
    findings: list[Finding]  # all, deduplicated; errors among `blocking` stop every task

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error" and f.code in MACHINE_CODES]

    def to_dict(self) -> dict[str, Any]:
        a = self.accelerator
        return {
            "indices": self.indices, "count": len(self.indices), "detected": self.device.to_dict(),
            "accelerator": {"id": a.id, "name": a.name, "matched": self.matched,
                            "memory_bytes": a.memory_bytes,
                            "compute_capability": a.cc_str, "platform": a.platform,
                            "arch_target": a.arch_target},
            "capabilities": [c.to_dict() for c in self.capabilities],
            "tasks": [t.to_dict() for t in self.tasks],
            "blocking": [f.code for f in self.blocking],
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclass
class DoctorReport:
    machine: MachineInfo
    devices: list[DeviceReport] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    verdict: str = ""
    exit_code: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"machine": self.machine.to_dict(), "devices": [d.to_dict() for d in self.devices],
                "findings": [f.to_dict() for f in self.findings], "verdict": self.verdict,
                "exit_code": self.exit_code}


def match_accelerator(dev: Device) -> tuple[Accelerator, str]:
    """The catalog card for a detected device, with the detected facts laid over it."""
    acc: Accelerator | None = None
    try:
        acc = resolve_accelerator(dev.name)
    except TuneplanError:
        acc = None
    if acc is not None and dev.memory_total_bytes and acc.memory_bytes:
        if abs(dev.memory_total_bytes - acc.memory_bytes) > MEMORY_MATCH_TOLERANCE * acc.memory_bytes:
            acc = None  # same family, different memory SKU: trust what was detected
    detected: dict[str, Any] = {}
    if dev.memory_total_bytes:
        detected["memory_gib_usable_observed"] = dev.memory_total_bytes / GIB
    if dev.compute_capability:
        detected["compute_capability"] = dev.compute_capability
        detected["compute_target"] = ".".join(map(str, dev.compute_capability))
    if acc is not None:
        return replace(acc, **detected), acc.id
    slug = re.sub(r"[^a-z0-9]+", "-", dev.name.lower()).strip("-")
    target = dev.arch_target or detected.get("compute_target")
    if dev.kind == "npu" and target and not target.lower().startswith("ascend"):
        target = f"Ascend{target}"  # npu-smi prints '910B3'; the rules key on the SoC family
    base = Accelerator(id=f"detected-{slug}", name=dev.name, vendor=VENDOR.get(dev.kind, "unknown"),
                       memory_gb_marketed=None, source="detected on this machine", verified="detected")
    return replace(base, **{**detected, "compute_target": target}), "detected only"


# Rules about the machine itself (PyTorch build, driver, torch_npu): they break every task alike, so a
# task row names them instead of repeating them.
MACHINE_CODES = frozenset({"torch-arch-missing", "torch-no-gpu-build", "torch-npu-mismatch",
                           "driver-too-old"})


def _task_setup(task: Task, caps: dict[str, bool | None]) -> TrainSetup:
    # the precision that card can use, so each task isolates its own feature
    precision = "bf16-mixed" if caps.get("bf16") is not False else "fp16-mixed"
    kw = {"precision": precision, "attn": "sdpa", "optimizer": "adamw", **task.setup}
    return TrainSetup(**kw)


def run_task(task: Task, acc: Accelerator, versions: dict[str, Any],
             caps: dict[str, bool | None]) -> tuple[TaskResult, list[Finding]]:
    findings = check(acc, _task_setup(task, caps), None, versions)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        own = [f for f in errors if f.code not in MACHINE_CODES]
        machine = [f.code for f in errors if f.code in MACHINE_CODES]
        detail = "; ".join([f.message for f in own]
                           + ([f"blocked by {', '.join(machine)} (below)"] if machine else []))
        fix = " | ".join(dict.fromkeys(f.fix for f in own)) or "fix the blocking findings below"
        return TaskResult(task.key, task.label, "breaks", detail, fix), findings
    needs = list(task.needs)
    # transformers routes FA2 to torch_npu (rule flash-attn-npu)
    if acc.platform == "npu" and "flash_attn" in needs:
        needs[needs.index("flash_attn")] = "torch_npu"
    missing = [lib for lib in needs if not versions.get(lib)]
    if missing:
        return TaskResult(task.key, task.label, "not installed", f"missing: {', '.join(missing)}",
                          "; ".join(PIP.get(lib, f"pip install {lib}") for lib in missing if lib != "torch")
                          or "install PyTorch"), findings
    warnings = [f for f in findings if f.level == "warning"]
    if warnings:
        return TaskResult(task.key, task.label, "works, with warnings",
                          "; ".join(f.message for f in warnings),
                          " | ".join(dict.fromkeys(f.fix for f in warnings))), findings
    return TaskResult(task.key, task.label, "works"), findings


def _group(devices: list[Device]) -> list[tuple[list[int], Device]]:
    groups: dict[tuple[Any, ...], tuple[list[int], Device]] = {}
    for d in devices:
        k = (d.kind, d.name, d.compute_capability, d.arch_target,
             round((d.memory_total_bytes or 0) / GIB))
        groups.setdefault(k, ([], d))[0].append(d.index)
    return list(groups.values())


NO_ACCELERATOR = Finding(
    "info", "no-accelerator",
    "no NVIDIA GPU, Ascend NPU or ROCm GPU found on this machine: nothing here can train on an accelerator",
    "plan for another machine with `tuneplan estimate ... --gpu <card>` (see `tuneplan accelerators`), or "
    "diagnose its `tuneplan doctor --json` output here with `tuneplan doctor --machine FILE`",
    "tuneplan doctor: NVML (nvidia-ml-py), nvidia-smi, npu-smi, torch_npu and torch.version.hip found no "
    "device")


def diagnose(machine: MachineInfo) -> DoctorReport:
    """What works and what breaks on ``machine``; exit code 1 only when plain LoRA breaks on a device."""
    report = DoctorReport(machine=machine)
    versions = machine.compat_versions()
    if not machine.devices:
        report.findings.append(NO_ACCELERATOR)
        report.verdict = "no GPU or NPU found: nothing to check on this machine (exit 0)"
        return report
    for indices, dev in _group(machine.devices):
        acc, matched = match_accelerator(dev)
        caps = capabilities(acc)
        cap_ok = {c.name: c.ok for c in caps}
        results: list[Any] = []
        seen: dict[Any, Any] = {}
        for task in TASKS:
            res, fs = run_task(task, acc, versions, cap_ok)
            results.append(res)
            for f in fs:
                seen.setdefault(f.code, f)
        findings = sorted(seen.values(), key=lambda f: ("error", "warning", "info").index(f.level))
        report.devices.append(DeviceReport(indices, dev, acc, matched,
                                           [c for c in caps if c.name in SHOWN_CAPABILITIES], results,
                                           findings))
    broken = [d for d in report.devices if d.tasks[0].status == "breaks"]
    if broken:
        report.exit_code = 1
        lora = [run_task(TASKS[0], d.accelerator, versions, {c.name: c.ok for c in d.capabilities})[1]
                for d in broken]
        errors = {f.code: f for fs in lora for f in fs if f.level == "error"}
        report.verdict = (f"LoRA cannot run here as installed ({', '.join(errors)}). Fix: "
                          + " | ".join(dict.fromkeys(f.fix for f in errors.values())) + " (exit 1)")
    else:
        ok = [t.label for t in report.devices[0].tasks if t.status.startswith("works")]
        report.verdict = f"ready: {', '.join(ok)} work here" if ok else "the basics are not installed yet"
    return report
