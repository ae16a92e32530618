"""The real detector: ask this machine what it has. Every step may be missing; none may crash.

GPUs through NVML (``nvidia-ml-py``, the ``detect`` extra) or, without it, ``nvidia-smi``; Ascend NPUs
through ``npu-smi info`` or torch_npu; AMD GPUs through a ROCm build of torch; library versions from
the installed distributions; PyTorch's CUDA build and arch list from torch itself; and whether
``import bitsandbytes`` works, tried in a child process because on an unsupported card that import is
exactly what fails (as V100 and Ascend users report).
"""

from __future__ import annotations

import importlib.metadata as md
import platform
import re
import shutil
import subprocess
import sys
from typing import Any

from tuneplan.doctor.machine import Device, MachineInfo

MIB = 1024**2
# distribution names to try per library key (the same project is published under several spellings)
DISTRIBUTIONS = {
    "torch": ("torch",), "bitsandbytes": ("bitsandbytes",), "peft": ("peft",),
    "transformers": ("transformers",),
    "accelerate": ("accelerate",), "deepspeed": ("deepspeed",), "flash_attn": ("flash-attn", "flash_attn"),
    "flash_attn_3": ("flash_attn_3", "flash-attn-3"), "torch_npu": ("torch-npu", "torch_npu"),
    "triton": ("triton", "pytorch-triton-rocm"), "nvidia-ml-py": ("nvidia-ml-py",),
}
TIMEOUT_S = 60


def cuda_version_from_int(v: int) -> str:
    """NVML's CUDA driver version 12040 -> '12.4'."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def parse_nvidia_smi_csv(text: str) -> list[Device]:
    """Rows of `nvidia-smi --query-gpu=index,name,memory.total,memory.free,compute_cap
    --format=csv,noheader,nounits`."""
    out = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        cc = re.fullmatch(r"(\d+)\.(\d+)", parts[4]) if len(parts) > 4 else None
        out.append(Device(index=int(parts[0]), kind="cuda", name=parts[1],
                          memory_total_bytes=int(float(parts[2]) * MIB) if _is_num(parts[2]) else None,
                          memory_free_bytes=int(float(parts[3]) * MIB) if _is_num(parts[3]) else None,
                          compute_capability=(int(cc.group(1)), int(cc.group(2))) if cc else None))
    return out


def _is_num(s: str) -> bool:
    return bool(re.fullmatch(r"\d+(\.\d+)?", s))


def parse_npu_smi_info(text: str) -> list[Device]:
    """`npu-smi info`: a row '| <id> <name> | <health> | ...' then
    '| <chip> | <bus-id> | ... <used>/ <total> |'.

    The HBM total (MB) is the last 'used / total' pair on the second row of each NPU.
    """
    out: list[Device] = []
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    for i, ln in enumerate(lines):
        cells = [c.strip() for c in ln.strip("|").split("|")]
        head = re.fullmatch(r"(\d+)\s+(\S+)", cells[0]) if cells else None
        if not head or len(cells) < 3 or i + 1 >= len(lines):
            continue
        if not re.search(r"ascend|910|310|\d{3}[a-z]", head.group(2).lower()):
            continue  # the process table repeats '| <npu> <chip> |' rows: skip anything not a chip name
        pairs = re.findall(r"(\d+)\s*/\s*(\d+)", lines[i + 1])
        total = used = None
        if pairs:
            used, total = (int(x) * MIB for x in pairs[-1])
        out.append(Device(index=int(head.group(1)), kind="npu", name=head.group(2), memory_total_bytes=total,
                          memory_free_bytes=(total - used) if total is not None and used is not None
                          else None,
                          arch_target=head.group(2)))
    return out


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


class SystemDetector:
    """Detection on the machine this runs on."""

    def __init__(self, check_bnb_import: bool = True) -> None:
        self.check_bnb_import = check_bnb_import

    def detect(self) -> MachineInfo:
        m = MachineInfo(platform={"python": platform.python_version(), "os": platform.system(),
                                  "machine": platform.machine()})
        self._nvidia(m)
        self._npu(m)
        m.versions = self._versions(m)
        if not m.devices and m.versions.get("torch_hip"):
            self._rocm(m)
        has_cuda = any(d.kind == "cuda" for d in m.devices)
        if m.versions.get("bitsandbytes") and has_cuda and self.check_bnb_import:
            m.versions["bitsandbytes_import_error"] = self._bnb_import_error()
        if not m.devices:
            m.notes.append("no NVIDIA GPU (NVML / nvidia-smi), Ascend NPU (npu-smi / torch_npu) or ROCm GPU "
                           "found")
        return m

    def devices(self) -> list[Device]:
        """The NVIDIA and Ascend devices alone, without the library versions (the planner's host memory)."""
        m = MachineInfo()
        self._nvidia(m)
        self._npu(m)
        return m.devices

    # ---- NVIDIA ------------------------------------------------------------------------------------
    def _nvidia(self, m: MachineInfo) -> None:
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            m.notes.append("nvidia-ml-py not installed (pip install 'tuneplan[detect]'); trying nvidia-smi")
            self._nvidia_smi(m)
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # pynvml.NVMLError: library not found, driver not loaded, ...
            m.notes.append(f"NVML unavailable: {exc}")
            return
        try:
            m.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
            m.cuda_driver_version = cuda_version_from_int(int(pynvml.nvmlSystemGetCudaDriverVersion()))
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                try:
                    cc = tuple(int(x) for x in pynvml.nvmlDeviceGetCudaComputeCapability(h))
                except Exception:
                    cc = None
                m.devices.append(Device(index=i, kind="cuda", name=_text(pynvml.nvmlDeviceGetName(h)),
                                        memory_total_bytes=int(mem.total), memory_free_bytes=int(mem.free),
                                        compute_capability=cc))  # type: ignore[arg-type]
        except Exception as exc:
            m.notes.append(f"NVML query failed: {exc}")
        finally:
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass

    def _nvidia_smi(self, m: MachineInfo) -> None:
        if not shutil.which("nvidia-smi"):
            m.notes.append("nvidia-smi not found")
            return
        for fields in ("index,name,memory.total,memory.free,compute_cap,driver_version",
                       "index,name,memory.total,memory.free"):  # old drivers lack compute_cap
            r = _run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
            if r is not None and r.returncode == 0:
                m.devices.extend(parse_nvidia_smi_csv(r.stdout))
                first = r.stdout.strip().splitlines()[:1]
                if first and "driver_version" in fields:
                    m.driver_version = first[0].split(",")[-1].strip() or None
                return
        m.notes.append("nvidia-smi query failed")

    # ---- Ascend ------------------------------------------------------------------------------------
    def _npu(self, m: MachineInfo) -> None:
        if shutil.which("npu-smi"):
            r = _run(["npu-smi", "info"])
            if r is not None and r.returncode == 0:
                m.devices.extend(parse_npu_smi_info(r.stdout))
                return
            m.notes.append("npu-smi info failed")
        if _dist_version(DISTRIBUTIONS["torch_npu"]):
            try:
                import torch
                import torch_npu  # noqa: F401  registers torch.npu

                npu: Any = getattr(torch, "npu")  # noqa: B009  (torch_npu adds it at import; no stubs)
                for i in range(npu.device_count()):
                    free, total = npu.mem_get_info(i)
                    name = npu.get_device_name(i)
                    m.devices.append(Device(index=i, kind="npu", name=name, memory_total_bytes=int(total),
                                            memory_free_bytes=int(free), arch_target=name))
            except Exception as exc:
                m.notes.append(f"torch_npu device query failed: {exc}")

    # ---- AMD (through a ROCm build of torch) -----------------------------------------------------------
    def _rocm(self, m: MachineInfo) -> None:
        try:
            import torch

            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                free, total = torch.cuda.mem_get_info(i)
                m.devices.append(Device(index=i, kind="rocm", name=p.name, memory_total_bytes=int(total),
                                        memory_free_bytes=int(free),
                                        arch_target=getattr(p, "gcnArchName", None)))
        except Exception as exc:
            m.notes.append(f"ROCm device query failed: {exc}")

    # ---- libraries ---------------------------------------------------------------------------------
    def _versions(self, m: MachineInfo) -> dict[str, Any]:
        v: dict[str, Any] = {k: _dist_version(names) for k, names in DISTRIBUTIONS.items()}
        if v["torch"]:
            try:
                import torch

                v["torch"] = torch.__version__
                v["torch_cuda"] = torch.version.cuda
                v["torch_hip"] = getattr(torch.version, "hip", None)
                v["torch_arch_list"] = list(torch.cuda.get_arch_list()) if torch.cuda.is_available() else []
                has_cuda = any(d.kind == "cuda" for d in m.devices)
                if has_cuda and not torch.cuda.is_available() and v["torch_cuda"]:
                    m.notes.append("torch.cuda.is_available() is False although NVML sees GPUs (driver/CUDA "
                                   "mismatch?)")
            except Exception as exc:
                m.notes.append(f"import torch failed: {exc}")
        return v

    def _bnb_import_error(self) -> str | None:
        """None if `import bitsandbytes` works with GPU support; else its last error line."""
        code = "import bitsandbytes, sys; sys.stdout.write(bitsandbytes.__version__)"
        r = _run([sys.executable, "-c", code])
        if r is None:
            return "import bitsandbytes timed out"
        text = (r.stdout + r.stderr).strip()
        if r.returncode != 0:
            return (text.splitlines() or ["import failed"])[-1][:300]
        for line in text.splitlines():
            if "without GPU support" in line or "could not find the bitsandbytes CUDA binary" in line.lower():
                return line.strip()[:300]
        return None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _dist_version(names: tuple[str, ...]) -> str | None:
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            continue
    return None
