"""Memory readings of one run: the CUDA caching allocator, NVML, or (without a GPU) the host process.

Three sources, never blended (the calibration notes: compare like with like):
- ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``: what PyTorch hands out and what its
  caching allocator holds from CUDA; ``reset_peak_memory_stats`` lets one phase of a step be read alone.
- NVML (``nvidia-ml-py``, optional): device memory used, as nvidia-smi shows it, which adds the CUDA
  context and library workspaces. Sampled between phases (the allocator's reserved pool only grows within
  a step, so the sample after a phase sees that phase's reserved peak) and reported as a peak above the
  reading taken before this process touched the GPU (other processes' memory excluded).
- On a machine without a GPU: the process's resident set (Linux ``/proc/self/status`` VmRSS / VmHWM; the
  peak is reset per phase by writing ``5`` to ``/proc/self/clear_refs``, see proc(5)). Where that is not
  possible, ``resource.getrusage`` gives the lifetime peak only. Host figures are labelled as such: they
  include the allocator's and Python's own memory and are not GPU memory.
"""

from __future__ import annotations

import os
import re
import resource
import sys
from typing import Any


class MemoryCounters:
    """Common interface: current bytes, peak since the last reset, reset."""

    kind = "none"
    label = ""

    def current(self) -> int:
        raise NotImplementedError

    def peak(self) -> int:
        raise NotImplementedError

    def reset_peak(self) -> None:
        raise NotImplementedError

    def reserved_peak(self) -> int | None:
        return None

    def sample_device(self) -> None:
        """Take an NVML reading now (no-op without NVML)."""


class CudaCounters(MemoryCounters):
    kind = "cuda"
    label = "torch.cuda.max_memory_allocated"

    def __init__(self, torch: Any, device_index: int, nvml: NvmlSampler | None) -> None:
        self.torch = torch
        self.index = device_index
        self.nvml = nvml

    def current(self) -> int:
        return int(self.torch.cuda.memory_allocated(self.index))

    def peak(self) -> int:
        return int(self.torch.cuda.max_memory_allocated(self.index))

    def reserved_peak(self) -> int:
        return int(self.torch.cuda.max_memory_reserved(self.index))

    def reset_peak(self) -> None:
        self.torch.cuda.synchronize(self.index)
        self.torch.cuda.reset_peak_memory_stats(self.index)

    def sample_device(self) -> None:
        if self.nvml is not None:
            self.torch.cuda.synchronize(self.index)
            self.nvml.sample()


class HostCounters(MemoryCounters):
    """Resident set of this process, relative to a baseline taken before the model was built."""

    kind = "host"

    def __init__(self) -> None:
        self.resettable = _can_reset_hwm()
        what = ("host RSS peak (VmHWM, reset per phase)" if self.resettable else
                "host RSS lifetime peak (getrusage ru_maxrss)")
        self.label = f"{what} above the pre-load baseline; CPU run, not GPU memory"

    def current(self) -> int:
        return _status_kib("VmRSS") * 1024

    def peak(self) -> int:
        if self.resettable:
            return _status_kib("VmHWM") * 1024
        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale

    def reset_peak(self) -> None:
        if self.resettable:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")


def _status_kib(key: str) -> int:
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"^{key}:\s+(\d+)\s+kB", f.read(), re.M)
        if m:
            return int(m.group(1))
    except OSError:
        pass
    # Not Linux: the lifetime peak is the best available figure for both.
    scale = 1 if sys.platform == "darwin" else 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale // 1024


def _can_reset_hwm() -> bool:
    if not os.path.exists("/proc/self/clear_refs"):
        return False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class NvmlSampler:
    """NVML device memory (what nvidia-smi shows) for one GPU, and this process's share where visible."""

    def __init__(self, pynvml: Any, handle: Any, baseline: int) -> None:
        self.nvml = pynvml
        self.handle = handle
        self.baseline = baseline
        self.peak_used = baseline
        self.peak_process: int | None = None
        self.driver = _safe(lambda: _text(pynvml.nvmlSystemGetDriverVersion()))

    def _used(self) -> int:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def sample(self) -> None:
        self.peak_used = max(self.peak_used, self._used())
        mine = self._process_used()
        if mine is not None:
            self.peak_process = max(self.peak_process or 0, mine)

    def _process_used(self) -> int | None:
        try:
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except Exception:  # not supported on every driver / container
            return None
        for p in procs:
            if int(p.pid) == os.getpid() and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
        return None  # PID namespaces (containers) hide our own pid from NVML

    @property
    def peak_delta(self) -> int:
        return self.peak_used - self.baseline


def open_nvml(torch: Any, device_index: int) -> NvmlSampler | None:
    """An NVML sampler for the torch device, or None when nvidia-ml-py or the driver library is missing.

    Every device's memory is read before torch touches CUDA (``torch.cuda.set_device`` creates this
    process's context on CUDA 12), so the baseline excludes this process. The torch device is then matched
    by UUID, because CUDA_VISIBLE_DEVICES renumbers torch's indices but not NVML's.
    """
    try:
        import pynvml  # nvidia-ml-py, the `detect` extra
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        before = {}
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            before[_text(pynvml.nvmlDeviceGetUUID(h))] = (i, h, int(pynvml.nvmlDeviceGetMemoryInfo(h).used))
    except Exception:  # NVMLError_LibraryNotFound and friends
        return None
    uuid = _safe(lambda: str(torch.cuda.get_device_properties(device_index).uuid))
    if uuid:
        key = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
        if key in before:
            _, h, used = before[key]
            return NvmlSampler(pynvml, h, used)
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        for i, h, used in before.values():
            if i == device_index:
                return NvmlSampler(pynvml, h, used)
    return None


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:  # optional diagnostics only
        return None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
