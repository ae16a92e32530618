"""Result types shared by the three engines (analytic, simulate, measure) and every face.

``MemoryBreakdown`` is per GPU. ``components`` are the allocated bytes live at the peak instant and
sum exactly to ``allocated_peak_bytes``; ``instants`` gives the allocated total at every instant of the
step that was evaluated, so a face can show where the peak falls and by how much the others trail.

The analytic engine returns a subclass (``estimator.memory.AnalyticBreakdown``) that fixes the peak figures
at once and builds ``components``, ``instants``, ``bands`` and ``notes`` from the instants on first read
(:class:`built_on_read`): the same values, paid for only by the faces that show them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

GIB = 1024**3

# Display order and meaning of the components (the keys of MemoryBreakdown.components).
COMPONENTS: dict[str, str] = {
    "weights": "model weights resident on this GPU (16/32-bit, or quantized storage)",
    "quant_meta": "quantization metadata (absmax / scales, nested statistics)",
    "lora_adapters": "LoRA A/B matrices",
    "gradients": "gradients of trainable parameters (incl. DDP/ZeRO buckets)",
    "optimizer_states": "optimizer states (+ fp32 master partition under ZeRO)",
    "optimizer_temp": "optimizer step temporaries (foreach workspaces)",
    "activations": "activations saved for backward (or checkpoints + one recomputed layer)",
    "autocast_copies": "16-bit copies of fp32 weights made by autocast and saved for backward",
    "logits_loss": "logits and loss chain (fp32 upcast, log-softmax, its gradient)",
    "backward_temp": "activation gradients of the layer being back-propagated",
    "parallel_buffers": "ZeRO-3/FSDP gathered parameters and prefetch buffers",
    "framework": "framework workspaces counted by the allocator (cuBLAS workspace)",
}


class built_on_read:  # noqa: N801 - used as a decorator, like ``property``
    """A field computed by the decorated method on first read and then stored on the instance: a non-data
    descriptor, so the stored value is what every later read (and any edit: simulate's fallback adds a note)
    sees. (``functools.cached_property`` does the same behind a lock on Python 3.11.)"""

    __slots__ = ("fn", "name")

    def __init__(self, fn: Any) -> None:
        self.fn, self.name = fn, fn.__name__

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass
class Band:
    """An uncertainty band around a figure: low and high bytes, with the reason. (Not frozen: two are made per
    estimate, and a frozen dataclass's ``__init__`` costs several times as much.)"""

    low: int
    high: int
    why: str


@dataclass
class MemoryBreakdown:
    """Per-GPU peak memory of one training step, by component and by instant."""

    components: dict[str, int]
    peak_instant: str
    instants: dict[str, int]
    reserved_peak_bytes: int
    cuda_context_bytes: int
    nccl_bytes: int = 0
    paged_bytes: int = 0  # unified (paged) memory of paged optimizers: outside the allocator
    host_bytes: int = 0  # CPU memory the run needs beyond the usual (offloaded states/params)
    engine: str = "analytic"
    bands: dict[str, Band] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    wrapper: str = ""  # the data-parallel wrapper a simulation ran (e.g. FSDP1); "" when none ran
    # device_map runs: every card's figures (estimator/device_map.CardMemory.to_dict); [] otherwise
    per_card: list[dict[str, Any]] = field(default_factory=list)

    @property
    def allocated_peak_bytes(self) -> int:
        return sum(self.components.values())

    @property
    def device_peak_bytes(self) -> int:
        """What nvidia-smi shows and what OOM is judged against."""
        return self.reserved_peak_bytes + self.cuda_context_bytes + self.nccl_bytes

    # The upper band: each figure at the high end of its band ("allocated": the activation and loss terms;
    # "reserved": with fragmentation; "cuda_context": driver and CUDA version); a band that is missing counts
    # at its central figure, and NCCL has none.
    @property
    def allocated_high_bytes(self) -> int:
        band = self.bands.get("allocated")
        return band.high if band is not None else self.allocated_peak_bytes

    @property
    def reserved_high_bytes(self) -> int:
        band = self.bands.get("reserved")
        return band.high if band is not None else self.reserved_peak_bytes

    @property
    def device_peak_high_bytes(self) -> int:
        """reserved high + CUDA context high + NCCL: the device peak with each term at its high end."""
        band = self.bands.get("cuda_context")
        context = band.high if band is not None else self.cuda_context_bytes
        return self.reserved_high_bytes + context + self.nccl_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "wrapper": self.wrapper,
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "reserved_peak_bytes": self.reserved_peak_bytes,
            "device_peak_bytes": self.device_peak_bytes,
            "cuda_context_bytes": self.cuda_context_bytes,
            "nccl_bytes": self.nccl_bytes,
            "paged_bytes": self.paged_bytes,
            "host_bytes": self.host_bytes,
            "components": dict(self.components),
            "instants": dict(self.instants),
            "peak_instant": self.peak_instant,
            "bands": {k: asdict(v) for k, v in self.bands.items()},
            "notes": list(self.notes),
            **({"per_card": list(self.per_card)} if self.per_card else {}),
        }
