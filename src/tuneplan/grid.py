"""Whole grids of setups at once: per-GPU memory of every combination of the given axes, as numpy arrays.

    >>> import tuneplan
    >>> g = tuneplan.estimate_grid("llama-2-7b", gpu="rtx4090", method="lora", batch=range(1, 65),
    ...                            seq=[256, 512, 1024, 2048], rank=[8, 16, 32, 64])
    >>> g.shape, g.device_peak[0, 1, 2], g.fits.sum()

Any setup field may be a sequence (a list, tuple, range or 1-D array; a string is one value). The result's
arrays are shaped like the product of the sequence-valued axes, in the order they were given.

How it is evaluated: ``batch`` and ``seq`` are vectorized. Every memory term is a closed form in
t = batch x seq tokens and s = seq (per layer kind, t x per_token + t x s x per_token_per_pos; the logits
chain, t x vocabulary), so ``instants.memory_at`` evaluates the same formulas the scalar ``tuneplan.estimate``
uses on numpy arrays of every (batch, seq) at once, then picks each cell's peak instant (the first on a tie,
as the scalar path does) and applies the caching allocator's rounding element-wise. Every other axis (rank,
grad_accum, gpus, zero, method, precision, ...) changes what is resolved (the parameter plan, the layer
ledgers, the sharding), so the grid resolves one ``Run`` per combination of those axes (a loop over, e.g.,
4 ranks, not over configurations) and evaluates the whole batch x seq plane on each.
Findings (compatibility rules) are per resolved run: no rule reads the batch size or the sequence length.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

import numpy as np

from tuneplan.errors import TuneplanError
from tuneplan.estimator.allocator_segments import LOSS_INSTANTS, reserved_figures
from tuneplan.estimator.instants import STEP_COMPONENTS, memory_at, named
from tuneplan.estimator.overhead import cuda_context_bytes
from tuneplan.estimator.run import Run, resolve_run
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

VECTOR_AXES = ("batch", "seq")
PERSISTENT = ("weights", "quant_meta", "lora_adapters", "optimizer_states", "framework")
COMPONENT_ORDER = PERSISTENT + STEP_COMPONENTS
MAX_SEQ = 4_194_304  # TrainSetup.validate's bound
EXACT_LIMIT = 2**53  # float64 holds every integer below it: the grid's products stay exact


@dataclass
class Grid:
    """Per-GPU memory over a product of axes: every array has shape ``shape`` (the axes' lengths, in
    order)."""

    axes: dict[str, tuple[Any, ...]]
    allocated: np.ndarray  # allocated peak bytes (int64)
    reserved: np.ndarray  # caching-allocator reserved bytes at the peak
    device_peak: np.ndarray  # reserved + CUDA context + NCCL: what nvidia-smi shows
    device_needed: np.ndarray  # the device peak less the free segments the allocator releases: the verdict's
    components: dict[str, np.ndarray]  # allocated bytes of each component at the peak instant
    peak_instant: np.ndarray  # the instant of the peak (str)
    errors: np.ndarray  # an error finding (cannot run, memory aside), or not a valid setup
    valid: np.ndarray  # the setup is valid (a combination such as ZeRO on one GPU is not: its figures are 0)
    gpu: Accelerator | None = None
    runs: dict[tuple[Any, ...], Run] = field(default_factory=dict, repr=False)  # by the looped axes' values
    invalid: dict[tuple[Any, ...], str] = field(default_factory=dict)  # looped axes' values -> why not valid

    @property
    def shape(self) -> tuple[int, ...]:
        return self.allocated.shape

    @property
    def fits(self) -> np.ndarray | None:
        """``Estimate.fits`` element-wise: a valid setup, no error finding and the device peak within the
        card; None without a GPU."""
        if self.gpu is None:
            return None
        return self.valid & ~self.errors & (self.device_needed <= self.gpu.memory_bytes)

    @property
    def headroom(self) -> np.ndarray | None:
        return None if self.gpu is None else self.gpu.memory_bytes - self.device_needed

    @property
    def size(self) -> int:
        return int(self.allocated.size)


def _values(name: str, v: Any) -> tuple[Any, ...] | None:
    """The axis values of a sequence-valued field, or None for a single value."""
    if isinstance(v, (str, bytes, dict)) or not hasattr(v, "__iter__"):
        return None
    vals = tuple(value.item() if isinstance(value, np.generic) else value for value in v)
    if not vals:
        raise TuneplanError("an axis needs at least one value", field=name, accepted="a non-empty sequence")
    return vals


def _shape_axis(name: str, vals: tuple[Any, ...]) -> np.ndarray:
    for value in vals:
        # (a plain int skips the ABC check: an isinstance against Integral costs more than the rest)
        if (value.__class__ is not int and (isinstance(value, bool) or not isinstance(value, Integral))
                or int(value) <= 0):
            raise TuneplanError(f"must be a positive integer, got {value!r}", field=name,
                                accepted="1, 2, 3, ...")
        if name == "seq" and int(value) > MAX_SEQ:
            raise TuneplanError(f"{value} tokens is beyond any model's context", field="seq",
                                accepted=f"1..{MAX_SEQ}")
    return np.asarray(vals, dtype=np.int64)


def _first_largest(totals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``np.argmax(totals, axis=0)``, ``totals.max(axis=0)``): the first instant with the largest total
    of each cell and that total, in one pass per instant (a later instant takes a cell only when it is
    strictly larger, as argmax keeps the first of equals). A reduction over the instants' axis of an
    [instant, batch, seq] array strides across the planes: measured 69 -> 45 us on a 5 x 64 x 64 plane."""
    allocated = totals[0].copy()
    peak = np.zeros(allocated.shape, dtype=np.intp)
    for i in range(1, len(totals)):
        np.copyto(peak, i, where=totals[i] > allocated)
        np.maximum(allocated, totals[i], out=allocated)
    return peak, allocated


def memory_plane(run: Run, batch: np.ndarray, seq: np.ndarray) -> dict[str, np.ndarray]:
    """The memory of ``run`` at every (batch, seq) of two broadcastable int64 arrays: ``instants.memory_at``
    on arrays, then the scalar path's peak choice (``memory.memory_of``: the first instant with the largest
    total) and the allocator's rounding, element-wise; ``peak_instant``: the peak instant's name."""
    out, names, peak = plane_figures(run, batch, seq)
    out["peak_instant"] = np.asarray(names).take(peak)
    return out


def plane_figures(run: Run, batch: np.ndarray, seq: np.ndarray
                  ) -> tuple[dict[str, np.ndarray], list[str], np.ndarray]:
    """:func:`memory_plane` without ``peak_instant``: (its other figures, the instants' names, the peak
    instant's index in them per cell). ``estimate_grid`` turns the indices of all its planes into names
    once (each plane's array of names is a copy of a long string per cell)."""
    shape = np.broadcast_shapes(batch.shape, seq.shape)
    m = memory_at(run, batch, seq)
    names = list(m.rows)
    # the instants' totals (exact int64 sums), and the first largest of each cell, as max() over a dict
    totals = np.empty((len(names),) + shape, dtype=np.int64)
    for i, instant in enumerate(names):
        totals[i] = m.total(instant)
    peak, allocated = _first_largest(totals)
    forward, backward_start = LOSS_INSTANTS
    at_forward, at_backward_start = totals[names.index(forward)], totals[names.index(backward_start)]
    reserved, needed = reserved_figures(run, allocated, at_forward, at_backward_start, batch * seq)
    outside = cuda_context_bytes() + m.statics.wrapped.resident.nccl
    out = {"allocated": allocated, "reserved": reserved, "device_peak": reserved + outside,
           "device_needed": needed + outside}
    for component in PERSISTENT:  # the same at every instant
        out[f"c:{component}"] = np.full(shape, m.statics.common[component], dtype=np.int64)
    rows = [named(m.rows[instant]) for instant in names]
    at_peak = None  # the peak instant's cell of each (batch, seq) in the flat [instant, batch, seq] array
    for component in STEP_COMPONENTS:
        vals = [getattr(row, component) for row in rows]
        if all(type(v) is int for v in vals):
            out[f"c:{component}"] = np.asarray(vals, dtype=np.int64)[peak]  # the same at every (batch, seq)
        else:
            # the totals' array is free again: each instant's value in it, then the peak's value picked
            # (np.take_along_axis(totals, peak[None], 0)[0], with its index array made once per plane)
            for i, v in enumerate(vals):
                totals[i] = v
            if at_peak is None:
                cells = peak.size
                at_peak = peak.ravel() * cells + np.arange(cells)
            out[f"c:{component}"] = totals.reshape(-1)[at_peak].reshape(shape)
    return out, names, peak


def estimate_grid(model: str | ModelSpec, setup: TrainSetup | None = None, *,
                  gpu: str | Accelerator | None = None, hardware_file: str | None = None,
                  **axes: Any) -> Grid:
    """Per-GPU memory of every combination of ``axes`` (setup fields; any may be a sequence): see the
    module."""
    from tuneplan.api import build_setup
    from tuneplan.catalog.accelerators import resolve_accelerator
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.device_map import refuse_in_search

    refuse_in_search(axes.get("device_map", setup.device_map if setup else None))
    spec = resolve_model(model) if isinstance(model, str) else model
    accelerator = resolve_accelerator(gpu, extra=hardware_file) if isinstance(gpu, str) else gpu
    grid_axes = {k: vals for k, v in axes.items() if (vals := _values(k, v)) is not None}
    fixed = {k: v for k, v in axes.items() if k not in grid_axes}
    b_default = setup.batch if setup else TrainSetup.batch
    s_default = setup.seq if setup else TrainSetup.seq
    b_vals = grid_axes.get("batch", (fixed.pop("batch", None) or b_default,))
    s_vals = grid_axes.get("seq", (fixed.pop("seq", None) or s_default,))
    batches = _shape_axis("batch", b_vals)
    seqs = _shape_axis("seq", s_vals)
    # t x s x bytes per position stays exact
    if int(batches.max()) * int(seqs.max()) ** 2 * 1024 >= EXACT_LIMIT * 1024:
        raise TuneplanError("batch x seq x seq is too large to evaluate exactly", field="seq",
                            accepted=f"batch x seq^2 below {EXACT_LIMIT}")
    looped = [k for k in grid_axes if k not in VECTOR_AXES]
    lead = tuple(len(grid_axes[k]) for k in looped)
    plane = (len(batches), len(seqs))
    # one array per figure, [combination of the looped axes, batch, seq]; an invalid combination stays 0
    out: dict[str, np.ndarray] = {}
    valid = np.zeros(math.prod(lead), dtype=bool)
    errors = np.ones(math.prod(lead), dtype=bool)
    runs: dict[tuple[Any, ...], Run] = {}
    invalid: dict[tuple[Any, ...], str] = {}
    first_error: TuneplanError | None = None
    # every instant named by a plane, by its index in the grid's names ("", index 0: an invalid
    # combination), and each cell's peak instant as that index: the names are taken once at the end
    names_at: dict[str, int] = {"": 0}
    peaks = np.zeros((len(valid),) + plane, dtype=np.intp)
    for i, combo in enumerate(itertools.product(*(grid_axes[k] for k in looped))):
        kw = {**fixed, **dict(zip(looped, combo, strict=True)), "batch": int(batches[0]), "seq": int(seqs[0])}
        try:
            run = resolve_run(spec, build_setup(spec, setup, accelerator=accelerator, **kw))
        except TuneplanError as e:  # this combination of the looped axes is not a valid setup
            first_error = first_error or e
            invalid[combo] = str(e)
            continue
        runs[combo] = run
        figures, names, peak = plane_figures(run, batches[:, None], seqs[None, :])
        grid_index = [names_at.setdefault(n, len(names_at)) for n in names]
        peaks[i] = np.asarray(grid_index, dtype=np.intp).take(peak)
        for k, v in figures.items():
            stack = out.get(k)
            if stack is None:  # the first plane: the array, zero-filled, in this plane's dtype
                stack = out[k] = np.zeros((len(valid),) + plane, dtype=v.dtype)
            stack[i] = v
        valid[i] = True
        errors[i] = any(f.level == "error" for f in run.findings(accelerator))
    if not runs:
        assert first_error is not None
        raise first_error  # no combination is valid: the input itself is wrong
    out["peak_instant"] = np.asarray(list(names_at)).take(peaks)  # the longest name sets the dtype
    # [looped..., batch, seq] -> the caller's axis order, without the batch / seq axes that were single values
    order = looped + ["batch", "seq"]
    want = list(grid_axes)
    kept = [k for k in order if k in grid_axes]
    squeeze = tuple(i for i, k in enumerate(order) if k in VECTOR_AXES and k not in grid_axes)

    def arrange(values: np.ndarray) -> np.ndarray:
        values = values.reshape(lead + plane)
        values = np.squeeze(values, axis=squeeze) if squeeze else values
        return np.transpose(values, [kept.index(k) for k in want]) if kept != want else values

    def per_cell(flags: np.ndarray) -> np.ndarray:
        return arrange(np.repeat(flags, plane[0] * plane[1]).reshape((len(flags),) + plane))

    return Grid(axes={k: grid_axes[k] for k in want}, allocated=arrange(out["allocated"]),
                reserved=arrange(out["reserved"]), device_peak=arrange(out["device_peak"]),
                device_needed=arrange(out["device_needed"]),
                components={component: arrange(out[f"c:{component}"]) for component in COMPONENT_ORDER},
                peak_instant=arrange(out["peak_instant"]), errors=per_cell(errors), valid=per_cell(valid),
                gpu=accelerator, runs=runs, invalid=invalid)
