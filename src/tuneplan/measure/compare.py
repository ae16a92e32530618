"""Measured figures next to the analytic estimate of the same run, quantity by quantity.

Only quantities both sides define are paired (the estimate's components and its per-instant totals,
``MemoryBreakdown.instants``); a measured phase ("forward", "backward") is compared with the largest of the
estimate's instants in that phase (named ``forward...`` / ``backward...``: FSDP2's forward copy-outs and
the layers' backward rows included). On a CPU run the measured side is host RSS and the pairing is
labelled indicative.
"""

from __future__ import annotations

from typing import Any

from tuneplan.estimator.types import MemoryBreakdown
from tuneplan.measure.runner import MeasureResult


def phase_peak(instants: dict[str, int], phase: str) -> int | None:
    """The largest allocated total among the estimate's instants of a measured phase (by name prefix)."""
    return max((v for k, v in instants.items() if k.startswith(phase)), default=None)


def _row(quantity: str, measured: int | None, estimated: int | None, note: str = "") -> dict[str, Any]:
    ratio = measured / estimated if measured is not None and estimated else None
    return {"quantity": quantity, "measured_bytes": measured, "estimated_bytes": estimated,
            "measured_over_estimated": ratio, "note": note}


def compare(result: MeasureResult, breakdown: MemoryBreakdown) -> list[dict[str, Any]]:
    c = breakdown.components
    ph = breakdown.instants
    persistent = c.get("weights", 0) + c.get("quant_meta", 0) + c.get("lora_adapters", 0)
    after_step = persistent + c.get("optimizer_states", 0) + c.get("framework", 0)
    rows = [
        _row("weights + quantized storage + adapters (before step 1)", result.persistent_bytes, persistent),
        _row("+ optimizer states + cuBLAS workspace (after a step)", result.after_step_bytes, after_step),
        _row("gradients (before optimizer.step)", result.gradient_bytes, None,
             "the estimate shows gradients only at its peak instant"),
        _row("peak during forward + loss", result.phase_peaks.get("forward"), phase_peak(ph, "forward")),
        _row("peak during backward", result.phase_peaks.get("backward"), phase_peak(ph, "backward")),
        _row("peak during optimizer step", result.phase_peaks.get("optimizer_step"),
             ph.get("optimizer_step")),
        _row("allocated peak", result.peak_bytes, breakdown.allocated_peak_bytes),
    ]
    if result.memory_kind == "cuda":
        rows.append(_row("reserved peak (max_memory_reserved)", result.reserved_peak_bytes,
                         breakdown.reserved_peak_bytes))
        nvml = result.nvml_process_peak_bytes or result.nvml_device_peak_bytes
        rows.append(_row("device peak (NVML, incl. CUDA context)", nvml, breakdown.device_peak_bytes,
                         "" if nvml is not None else "NVML not available"))
    else:
        for r in rows:
            r["note"] = (r["note"] + "; " if r["note"] else "") + "host RSS, indicative only"
    return rows
