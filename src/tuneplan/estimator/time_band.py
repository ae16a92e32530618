"""The time band: the range of step time a user should plan for, mechanism by mechanism.

The step is the sum of five parts (``StepTime.breakdown``): compute, memory_bound, communication, offload,
overhead. Each rests on constants known to a different degree, so each gets its own relative half-width
``sigma`` and the band is ``low = sum(part / (1 + sigma))``, ``high = sum(part x (1 + sigma))``: the parts
are added at their ends together (no cancellation assumed between mechanisms), which is what a user
planning hours and money should budget for. The same widths weigh the calibration's correction
(``measure/calibration.py``): the less a mechanism is known, the more of a measured difference it takes.

Widths, and why:
- compute: the card's sustained fraction of its dense tensor peak: 0.10 where published GEMM measurements
  exist for the card (``catalog/card_efficiency.toml``, ``known = "measured"``), 0.20 where the peak is the
  vendor's figure and the fraction that of its class (``spec-derived``), 0.35 where the figures themselves
  are third-party or borrowed from a sibling card (``proxy``): the classes' fractions span 0.5-0.92.
- memory_bound: 0.25: element-wise bytes are counted per op, but the fraction of bandwidth PyTorch's
  kernels reach (0.7 taken) lies between ~0.55 and ~0.9 (STREAM-like copies reach 0.85-0.9).
- communication: 0.3 on NVLink / InfiniBand (NCCL bus bandwidth within ~25 % of the line rate on tuned
  systems); 2.0 on PCIe when the user did not state the link (``--link``): a board that splits the slot
  x8/x8 or runs PCIe 3.0 carries a half to a quarter of the catalog's x16 rate, and peer-to-peer decides
  another 2x; 0.5 when the link is stated.
- offload: 0.5: host memory bandwidth shared with the other ranks (20 GB/s per GPU assumed).
- overhead: 0.6: CPU cost per dispatched op, 5-25 us across machines (15 taken).
A calibrated mechanism (``step_calibration``) keeps 0.05 when measured at two or more shapes (what a
measured step leaves to chance), half its width when measured at one.
"""

from __future__ import annotations

from typing import Any

CALIBRATED_SIGMA = 0.05
COMPUTE_SIGMA = {"measured": 0.10, "spec-derived": 0.20, "proxy": 0.35}
MEMORY_SIGMA = 0.25
COMM_SIGMA_FAST = 0.30
COMM_SIGMA_PCIE_UNSTATED = 2.0
COMM_SIGMA_STATED = 0.5
OFFLOAD_SIGMA = 0.5
OVERHEAD_SIGMA = 0.6
PARTS = ("compute", "memory_bound", "communication", "offload", "overhead")


def part_sigmas(known: str, link_name: str, link_stated: bool) -> dict[str, float]:
    """Relative half-width of each part (see the module doc)."""
    if link_stated:
        comm = COMM_SIGMA_STATED
    else:
        comm = COMM_SIGMA_PCIE_UNSTATED if link_name.startswith("PCIe") else COMM_SIGMA_FAST
    return {"compute": COMPUTE_SIGMA.get(known, COMPUTE_SIGMA["proxy"]), "memory_bound": MEMORY_SIGMA,
            "communication": comm, "offload": OFFLOAD_SIGMA, "overhead": OVERHEAD_SIGMA}


def calibrated_sigmas(sigmas: dict[str, float], parts: set[str], shapes: int) -> dict[str, float]:
    """Widths after calibration: measured at two or more shapes, a corrected part keeps
    ``CALIBRATED_SIGMA``; at one shape, half its width (one step pins the sum, not the split)."""
    return {k: (CALIBRATED_SIGMA if shapes >= 2 else max(CALIBRATED_SIGMA, v / 2)) if k in parts else v
            for k, v in sigmas.items()}


def step_band(breakdown: dict[str, float], sigmas: dict[str, float]) -> tuple[float, float]:
    """(low, high) step seconds: every part at the low / high end of its width."""
    lows, highs = [], []
    for k, v in breakdown.items():
        width = 1.0 + sigmas.get(k, 0.0)
        lows.append(v / width)
        highs.append(v * width)
    return sum(lows), sum(highs)


def band_section(step_s: float, breakdown: dict[str, float], sigmas: dict[str, float],
                 steps: float | None, cards: int) -> dict[str, Any]:
    """The ``time.band`` of an estimate: step seconds, tokens/s factors and hours at both ends."""
    low, high = step_band(breakdown, sigmas)
    out: dict[str, Any] = {"step_seconds_low": low, "step_seconds_high": high,
                           "relative_low": low / step_s - 1.0 if step_s else 0.0,
                           "relative_high": high / step_s - 1.0 if step_s else 0.0,
                           "widths": dict(sigmas)}
    if steps is not None:
        out["total_hours_low"] = steps * low / 3600.0
        out["total_hours_high"] = steps * high / 3600.0
        out["gpu_hours_high"] = out["total_hours_high"] * cards
    return out
