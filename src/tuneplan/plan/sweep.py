"""`sweep`: memory (by component) and time of one setup against one variable.

``--vary seq=512..8192`` doubles from 512 to 8192; ``rank=8..256:8`` steps by 8; ``gpus=1,2,4,8`` takes
the list. Each point is the estimator's answer at that value, every other field as given; the stack
(components, allocator reserve, CUDA context, NCCL) adds up to the device peak that ``fits`` is
judged on. The memory of every point comes from one :func:`tuneplan.estimate_grid` call over the
variable (batch and length in one vectorized plane, the other variables one resolved run each); the
time and cost of a point from the scalar time model on the grid's run, reshaped to the point.
Rendering (table, PNG/SVG/HTML) lives with the faces: :mod:`tuneplan.plan.sweep_plot`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from tuneplan.api import estimate, estimate_run
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.estimator.overhead import cuda_context_bytes
from tuneplan.grid import VECTOR_AXES, Grid, estimate_grid
from tuneplan.plan.timecost import dataset_kw, time_cost
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec

VARIABLES = ("seq", "batch", "rank", "gpus", "nodes", "grad_accum")
MAX_POINTS = 200  # a plot, not a search: past this use `fit`, which bisects
_RANGE = re.compile(r"^(\d+)\.\.(\d+)(?::(\d+))?$")


def parse_vary(spec: str) -> tuple[str, list[int]]:
    """``name=a..b`` (doubling), ``name=a..b:step`` (arithmetic), or ``name=v1,v2,...``."""
    accepted = "seq=512..8192 | rank=8..256:8 | gpus=1,2,4,8 (variables: " + ", ".join(VARIABLES) + ")"
    if "=" not in spec:
        raise TuneplanError(f"expected NAME=VALUES, got {spec!r}", field="vary", accepted=accepted)
    name, _, rng = (p.strip() for p in spec.partition("="))
    name = name.replace("-", "_")
    if name == "cutoff_len":
        name = "seq"
    if name not in VARIABLES:
        raise TuneplanError(f"cannot vary {name!r}", field="vary", accepted=accepted)
    m = _RANGE.match(rng.replace(" ", ""))
    if m:
        a, b, step = int(m[1]), int(m[2]), m[3]
        if a < 1 or b < a:
            raise TuneplanError(f"range {rng!r} must go up from at least 1", field="vary", accepted=accepted)
        if step is not None:
            if int(step) < 1:
                raise TuneplanError("step must be positive", field="vary", accepted=accepted)
            values = list(range(a, b + 1, int(step)))
        else:
            values, v = [], a
            while v <= b and len(values) <= MAX_POINTS:
                values.append(v)
                v *= 2
            if values[-1] != b and len(values) <= MAX_POINTS:
                values.append(b)
    else:
        try:
            values = [int(x) for x in rng.split(",") if x.strip()]
        except ValueError:
            raise TuneplanError(f"cannot read {rng!r}", field="vary", accepted=accepted) from None
        if not values or min(values) < 1:
            raise TuneplanError(f"values must be positive integers, got {rng!r}", field="vary",
                                accepted=accepted)
        values = sorted(set(values))
    if len(values) > MAX_POINTS:
        raise TuneplanError(f"{len(values)} points; at most {MAX_POINTS}", field="vary", accepted=accepted)
    return name, values


@dataclass
class SweepPoint:
    value: int
    fits: bool | None
    device_peak_bytes: int
    allocated_peak_bytes: int
    reserved_peak_bytes: int
    stack: dict[str, int]  # components + allocator_reserve + cuda_context + nccl = device peak
    peak_instant: str
    headroom_bytes: int | None = None
    total_hours: float | None = None
    tokens_per_second: float | None = None
    cloud_usd: float | None = None
    error: str | None = None  # the setup is refused at this value (e.g. rank on a full fine-tune)


@dataclass
class SweepResult:
    model: str
    variable: str
    gpu: dict[str, Any] | None
    capacity_bytes: int | None
    setup: dict[str, Any]
    points: list[SweepPoint] = field(default_factory=list)

    @property
    def evaluations(self) -> int:
        return len(self.points) + 1  # one per value, plus the user's own setup

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "variable": self.variable, "gpu": self.gpu,
                "capacity_bytes": self.capacity_bytes, "setup": self.setup,
                "points": [asdict(p) for p in self.points]}


def _point(value: int, est: Any) -> SweepPoint:
    """A point from a scalar estimate (when the grid cannot hold the sweep)."""
    b = est.breakdown
    stack = dict(b.components)
    stack["allocator_reserve"] = b.reserved_peak_bytes - b.allocated_peak_bytes
    stack["cuda_context"] = b.cuda_context_bytes
    stack["nccl"] = b.nccl_bytes
    tc = time_cost(est.to_dict())
    return SweepPoint(value=value, fits=est.fits, device_peak_bytes=b.device_peak_bytes,
                      allocated_peak_bytes=b.allocated_peak_bytes, reserved_peak_bytes=b.reserved_peak_bytes,
                      stack=stack, peak_instant=b.peak_instant, headroom_bytes=est.headroom_bytes,
                      total_hours=tc["total_hours"], tokens_per_second=tc["tokens_per_second"],
                      cloud_usd=tc["cloud_usd"])


def _grid_point(grid: Grid, i: int, value: int, run: Any, acc: Accelerator | None,
                extra: dict[str, Any]) -> SweepPoint:
    """Point ``i`` of a one-axis grid; its time and cost from ``run`` (the grid's run at this value)."""
    allocated, reserved, peak = int(grid.allocated[i]), int(grid.reserved[i]), int(grid.device_peak[i])
    stack = {c: int(v[i]) for c, v in grid.components.items()}
    stack["allocator_reserve"] = reserved - allocated
    stack["cuda_context"] = cuda_context_bytes()
    stack["nccl"] = peak - reserved - stack["cuda_context"]  # the device peak is reserved + context + NCCL
    fits = grid.fits
    sections = estimate_run(run, gpu=acc, **extra).extras.get("sections", {}) if acc is not None else {}
    tc = time_cost(sections)
    return SweepPoint(value=value, fits=bool(fits[i]) if fits is not None else None, device_peak_bytes=peak,
                      allocated_peak_bytes=allocated, reserved_peak_bytes=reserved, stack=stack,
                      peak_instant=str(grid.peak_instant[i]),
                      headroom_bytes=(acc.memory_bytes - int(grid.device_needed[i])
                                      if acc is not None else None),
                      total_hours=tc["total_hours"], tokens_per_second=tc["tokens_per_second"],
                      cloud_usd=tc["cloud_usd"])


def _refused(value: int, why: str) -> SweepPoint:
    return SweepPoint(value=value, fits=False, device_peak_bytes=0, allocated_peak_bytes=0,
                      reserved_peak_bytes=0, stack={}, peak_instant="", error=why)


def sweep(model: str | ModelSpec, vary: str, *, gpu: str | Accelerator | None = None, dataset: Any = None,
          **setup: Any) -> SweepResult:
    """The estimate at every value of ``vary`` (``"seq=512..8192"``), other fields as in ``setup``."""
    spec = resolve_model(model) if isinstance(model, str) else model
    acc = resolve_accelerator(gpu) if isinstance(gpu, str) else gpu
    name, values = parse_vary(vary)
    base = estimate(spec, gpu=acc, **setup)  # the user's own input must be valid
    extra = dataset_kw(dataset)
    out = SweepResult(model=spec.name, variable=name, gpu=acc.to_dict() if acc else None,
                      capacity_bytes=acc.memory_bytes if acc else None, setup=base.setup.to_dict())
    try:
        grid = estimate_grid(spec, gpu=acc, **{**setup, name: values})
    except TuneplanError:  # e.g. no value of the variable is valid: each point says why, one by one
        grid = None
    for i, v in enumerate(values):
        if grid is not None and name in VECTOR_AXES:
            out.points.append(_grid_point(grid, i, v, grid.runs[()].reshaped(**{name: v}), acc, extra))
        elif grid is not None and (v,) in grid.runs:
            out.points.append(_grid_point(grid, i, v, grid.runs[(v,)], acc, extra))
        elif grid is not None:
            out.points.append(_refused(v, grid.invalid[(v,)]))
        else:
            try:
                out.points.append(_point(v, estimate(spec, gpu=acc, **{**setup, name: v}, **extra)))
            except TuneplanError as exc:
                out.points.append(_refused(v, str(exc)))
    return out
