"""Inside one family: every micro-batch, with and without accumulation, from one grid; the global batch rule.

Memory depends on gradient accumulation only through "more than one micro-batch per step" (then the
gradients of the earlier micro-batches live through the next forward: ``estimator/memory.py`` tests
``grad_accum > 1``). So one grid, ``grad_accum`` {1, 2} x micro-batch 1..top at the family's sequence
length (the planes :func:`tuneplan.estimate_grid` evaluates), holds the memory of every size the rule
can pick (past 256 micro-batches the grid grows in doubling blocks only while its widest micro-batch
still fits: :func:`grid_width`). What passes is read off it for the card (its usable memory, the host
memory, the margin): every micro-batch of the grid is looked at, none is skipped by bisection. Nothing in
the grid depends on the card but its bf16 support (``api.build_setup``), so :class:`Shared` keeps the
grids, the resolved runs and the memory-only estimates for every card and layout of one question.

Global batch rule (``G`` sequences per optimizer step, ``W`` GPUs, ``top = ceil(G / W)``), on the
cells that pass:
1. micro-batch ``top`` without accumulation (global ``top x W``: ``G`` when ``W`` divides it);
2. else the largest micro-batch ``b < top`` that passes with accumulation and, where ``W`` divides
   ``G``, divides ``G / W``; accumulation ``ceil(G / (b x W))`` (within what a setup may have);
3. else the largest micro-batch that passes without accumulation: the global batch is relaxed to
   ``b x W`` and the answer says so.
Each step is tried first with the safety margin (:mod:`tuneplan.plan.margin`), then without it; a
candidate found only without it is *tight*.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tuneplan.api import Estimate, build_setup, estimate_run
from tuneplan.compat import check
from tuneplan.errors import TuneplanError
from tuneplan.estimator.run import Run, resolve_run
from tuneplan.grid import memory_plane
from tuneplan.plan.margin import Margin, required, upper_band
from tuneplan.specs.finding import Finding
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.limits import SETUP_INT_RANGES
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import model_as_built
from tuneplan.specs.setup import TrainSetup, check_fields

SHAPE = ("batch", "seq", "grad_accum")  # what a resolved run is reshaped to, never resolved again for
Items = tuple[tuple[str, Any], ...]
Key = tuple[bool | None, Items]  # the card's bf16 support (None: unknown), the setup fields but the sizes
BLOCK = 256  # micro-batches every family's grid covers (a global batch of 256 sequences per GPU)
BATCH_MAX = SETUP_INT_RANGES["batch"][1]  # the largest micro-batch a setup may have (specs/limits.py)
GA_MAX = SETUP_INT_RANGES["grad_accum"][1]  # ... and the most micro-batches per optimizer step


@dataclass(frozen=True)
class Row:
    """Per-GPU memory of a family at micro-batch 1..width, one accumulation regime (1-D arrays)."""

    device_peak: np.ndarray
    device_needed: np.ndarray  # the verdict's figure (MemoryBreakdown.device_needed_bytes)
    device_peak_high: np.ndarray  # the upper band (margin.upper_band)
    host: np.ndarray  # CPU memory per GPU for offloaded states / activations


class SizeGrid:
    """One family's per-GPU memory at micro-batch 1..width: row 0 without accumulation, row 1 with it,
    each one grid plane, evaluated when first read (a family whose widest micro-batch passes without
    accumulation never needs row 1). Card-independent: the card decides what passes (:meth:`passes`)."""

    def __init__(self, width: int, plane: Callable[[int], Row]):
        self.width = width
        self._plane = plane
        self._rows: dict[int, Row] = {}

    @property
    def cells(self) -> int:
        """Configurations evaluated so far."""
        return self.width * len(self._rows)

    def row(self, i: int) -> Row:
        if i not in self._rows:
            self._rows[i] = self._plane(i)
        return self._rows[i]

    def passes(self, i: int, memory: int, host_limit: int, gpus: int, margin: Margin | None) -> np.ndarray:
        """The planner's verdict on every cell of row ``i``: fits the card (``Estimate.fits``,
        compatibility being checked per family before), the node's host memory holds what all its GPUs
        offload, and with ``margin`` the safety margin (``margin.required``, element-wise)."""
        r = self.row(i)
        ok = (r.device_needed <= memory) & (r.host * gpus <= host_limit)
        if margin is None:
            return ok
        return ok & (required(margin, r.device_needed, r.device_peak_high, memory) <= memory)


def choose(ok: Callable[[int], np.ndarray], target: int, world: int) -> tuple[int, int] | None:
    """(micro-batch, accumulation) by the global batch rule of the module docstring, or None. ``ok(0)``
    and ``ok(1)`` are the verdicts without and with accumulation (:meth:`SizeGrid.passes`) over
    micro-batch 1..width (:func:`grid_width`: a micro-batch past the width does not pass); the second
    is asked for only when the first step fails."""
    top = max(1, -(-target // world))
    row0 = ok(0)
    width = row0.shape[0]
    if top <= width and row0[top - 1]:
        return top, 1
    if top == 1:
        return None
    row1 = ok(1)
    per_gpu = target // world if target % world == 0 else None
    for b in range(min(top - 1, width), 0, -1):
        ga = -(-target // (b * world))
        if row1[b - 1] and (per_gpu is None or per_gpu % b == 0) and ga <= GA_MAX:
            return b, ga
    fit1 = np.flatnonzero(row0[: min(top - 1, width)])
    return (int(fit1[-1]) + 1, 1) if fit1.size else None


def grid_width(top: int, last_passes: Callable[[int], bool]) -> int:
    """How many micro-batches a family's grid covers: all of 1..``top`` up to :data:`BLOCK`; past it,
    doubling while the widest micro-batch still fits (``last_passes(width)``), never past ``top`` or
    the largest micro-batch a setup may have. A global batch of thousands on one GPU would otherwise
    be a grid of thousands of micro-batches per family, almost none of which fit."""
    width = min(top, BLOCK, BATCH_MAX)
    while width < min(top, BATCH_MAX) and last_passes(width):
        width = min(2 * width, top, BATCH_MAX)
    return width


class Shared:
    """What does not depend on the card, kept across the cards and layouts of one question (one model):
    validated setups and resolved runs (by setup fields but the sizes), memory-only estimates (by setup),
    size grids (by family and top), and compatibility errors (by card and family). The card enters the
    setup only through its bf16 support, which is part of every key."""

    def __init__(self, model: ModelSpec):
        self.model = model
        self._setups: dict[Key, TrainSetup | TuneplanError] = {}
        self._runs: dict[Key, Run] = {}
        self._memory: dict[Key, Estimate | None] = {}
        self._grids: dict[tuple[bool | None, Items, int], SizeGrid | None] = {}
        self._findings: dict[tuple[Accelerator, Items], list[Finding] | TuneplanError] = {}

    def _key(self, acc: Accelerator, fields: Mapping[str, Any]) -> Key:
        return acc.supports_bf16, tuple(sorted((k, v) for k, v in fields.items() if k not in SHAPE))

    def setup(self, acc: Accelerator, fields: Mapping[str, Any]) -> TrainSetup:
        """``api.build_setup`` of ``fields`` but the sizes (raises the setup's TuneplanError)."""
        key = self._key(acc, fields)
        got = self._setups.get(key)
        if got is None:
            try:
                got = build_setup(self.model, None, accelerator=acc, **dict(key[1]))
            except TuneplanError as e:
                got = e
            self._setups[key] = got
        if isinstance(got, TuneplanError):
            raise got
        return got

    def run(self, acc: Accelerator, fields: Mapping[str, Any]) -> Run:
        """The resolved run of ``fields`` on ``acc`` at its sizes (raises the setup's TuneplanError)."""
        key = self._key(acc, fields)
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = resolve_run(self.model, self.setup(acc, fields))
            run.findings(acc)  # kept in the run's memo, which its reshaped copies carry
        shape = {k: v for k in SHAPE if k in fields and (v := fields[k]) != getattr(run.setup, k)}
        if not shape:
            return run
        # the sizes' own range checks, as build_setup's validation makes them (the same table)
        if not all(type(v) is int and SETUP_INT_RANGES[k][0] <= v <= SETUP_INT_RANGES[k][1]
                   for k, v in shape.items()):
            check_fields(shape)
        return run.reshaped(**shape)

    def findings(self, acc: Accelerator, fields: Mapping[str, Any]) -> list[Finding]:
        """The compatibility findings of ``fields`` on ``acc`` (``Run.findings``: the rules read the method,
        precision, optimizer, attention and strategy, never the sizes, catalog/compat_rules.toml), once
        per card and family (raises the setup's TuneplanError)."""
        run_key = self._key(acc, fields)
        key = (acc, run_key[1])  # the card itself: a copy with other memory is another card
        got = self._findings.get(key)
        if got is None:
            run = self._runs.get(run_key)
            try:
                s = self.setup(acc, fields)
            except TuneplanError as e:
                got = e
            else:  # a resolved run already holds them: the same check on the same model as built
                got = (run.findings(acc) if run is not None
                       else check(acc, s, model_as_built(self.model, s.framework, s.num_labels)))
            self._findings[key] = got
        if isinstance(got, TuneplanError):
            raise got
        return got

    def errors(self, acc: Accelerator, fields: Mapping[str, Any]) -> list[str]:
        """Why ``fields`` cannot run on ``acc`` at all (setup validation, then the compatibility rules'
        error findings); [] when it can. One check decides for a whole family."""
        try:
            return [f.message for f in self.findings(acc, fields) if f.level == "error"]
        except TuneplanError as exc:
            return [str(exc)]

    def memory(self, acc: Accelerator, fields: Mapping[str, Any], *,
               findings: bool = True) -> Estimate | None:
        """Memory-only ``estimate`` of ``fields`` on ``acc`` (None: not a valid setup). Without
        ``findings`` it may carry another card's findings (its memory figures are the same)."""
        key = (acc.supports_bf16, tuple(sorted(fields.items())))
        if key not in self._memory:
            try:
                run = self.run(acc, fields)
            except TuneplanError:
                self._memory[key] = None
            else:
                self._memory[key] = estimate_run(run, gpu=acc, timing=False)
        est = self._memory[key]
        if est is None or est.gpu is acc or not findings:
            return est
        return replace(est, gpu=acc, findings=list(self.findings(acc, fields)))  # another card: its own

    def grid(self, acc: Accelerator, fields: Mapping[str, Any], top: int) -> SizeGrid | None:
        """The family's :class:`SizeGrid` for micro-batch 1..``top`` (None: not a valid setup); ``top``
        is a width from :func:`grid_width`."""
        fixed = {k: v for k, v in fields.items() if k not in ("batch", "grad_accum")}
        key = (*self._key(acc, fixed), top)
        if key not in self._grids:
            try:
                self._grids[key] = self._size_grid(acc, fixed, top)
            except TuneplanError:
                self._grids[key] = None
        return self._grids[key]

    def _size_grid(self, acc: Accelerator, fixed: dict[str, Any], width: int) -> SizeGrid:
        """The grid's planes (``tuneplan.grid.memory_plane``, what ``estimate_grid`` evaluates for each
        resolved run) on the family's own run, without and with accumulation (``Run.reshaped``: nothing
        is resolved again)."""
        run = self.run(acc, {**fixed, "batch": 1, "grad_accum": 1})
        batch = np.arange(1, width + 1, dtype=np.int64)[None, :]
        seq = np.asarray([[run.setup.seq]], dtype=np.int64)
        # Host memory is not on the grid: the sharding's host share (states, parameters) plus activations
        # offloaded to the CPU, which exist only with activation offload or checkpoints offloaded by the
        # profile (``estimator/activations.activations_at``). Without them it is one figure for the family
        # (read at the widest micro-batch, the likeliest candidate); with them it grows with the
        # micro-batch: the scalar estimate of every cell.
        s = run.setup
        per_cell = s.activation_offload or (s.gradient_checkpointing and run.profile.gc_offload)

        def host(ga: int) -> np.ndarray:
            cells = range(1, width + 1) if per_cell else (width,)
            got = [self.memory(acc, {**fixed, "batch": b, "grad_accum": ga}) for b in cells]
            values = [e.breakdown.host_bytes if e is not None else 0 for e in got]
            return np.asarray(values if per_cell else values * width, dtype=np.int64)

        def plane(i: int) -> Row:
            p = memory_plane(run if i == 0 else run.reshaped(grad_accum=2), batch, seq)
            allocated, reserved, peak = p["allocated"][0], p["reserved"][0], p["device_peak"][0]
            high = upper_band(allocated, reserved, peak)
            return Row(device_peak=peak, device_needed=p["device_needed"][0], device_peak_high=high,
                       host=host(1 + i))

        return SizeGrid(width, plane)
