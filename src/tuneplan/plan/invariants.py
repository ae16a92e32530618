"""The planner's invariants, as one checker: the tests and benchmarks/planner_consistency.py call it.

For a ``fit`` report (its ``to_dict()``):
1. ``recommended`` is not null if and only if at least one method row fits (and so ``fit`` exits 0);
2. every row that fits has its candidate in the candidate list (same method, strategy, sizes), and
   the recommendation is one of the rows;
3. the recommendation keeps the margin whenever any candidate within the hard limits does (it is
   tight only when all are), and reaches the target global batch whenever such a candidate of its
   tightness does;
4. a row is "cannot run" only with reasons, and then no candidate of that method exists;
5. a row offloads to the CPU only when no candidate of its method runs without offload at the same
   standing (margin, global batch, hard limits);
6. under ``balanced``, the recommendation is within the slowdown limit of the fastest plan.
"""

from __future__ import annotations

from typing import Any


def violations(d: dict[str, Any]) -> list[str]:
    """The invariants a fit report breaks ([] when none)."""
    out = []
    rows, rec, cands = d["methods"], d["recommended"], d["candidates"]
    any_fits = any(m["fits"] for m in rows)
    if any_fits != (rec is not None):
        out.append(f"rows fit: {any_fits}, recommended: {rec is not None}")
    keys = {(c["method"], c["micro_batch"], c["grad_accum"]) for c in cands}
    for m in rows:
        if m["fits"] and (m["method"], m["micro_batch"], m["grad_accum"]) not in keys:
            out.append(f"row {m['method']} fits but is not in the candidate set")
        if not m["fits"] and any(c["method"] == m["method"] for c in cands):
            out.append(f"row {m['method']} does not fit but has candidates")
        if m["blocked_by"] and m["fits"]:
            out.append(f"row {m['method']} fits and is blocked")
        if m["fits"] and "offload" in (m["strategy"] or ""):
            standing = (m["tight"], (m["global_batch"] or 0) < d["global_batch"],
                        m.get("over_limit") is not None)
            if any(c["method"] == m["method"] and "offload" not in c["strategy"]
                   and (c["tight"], c["relaxed"], c.get("over_limit") is not None) <= standing
                   for c in cands):
                out.append(f"row {m['method']} offloads although a candidate of it runs without offload")
    if rec is not None:
        row = next((m for m in rows if m["method"] == rec["method"]), None)
        if row is None or not row["fits"] or (row["micro_batch"], row["grad_accum"], row["strategy"]) != (
                rec["micro_batch"], rec["grad_accum"], rec["strategy"]):
            out.append("the recommendation is not its method's row")
        inside = [c for c in cands if c.get("over_limit") is None]
        if rec["tight"] and any(not c["tight"] for c in inside):
            out.append("recommended tight although a candidate keeps the margin")
        same = [c for c in inside if c["tight"] == rec["tight"]]
        if rec["relaxed"] and any(not c["relaxed"] for c in same):
            out.append("recommended a relaxed global batch although a candidate reaches the target")
        limit = (d.get("limits") or {}).get("max_slowdown")
        slow = rec.get("slowdown")
        if d.get("prefer") == "balanced" and slow and limit and slow > limit * (1 + 1e-9):
            out.append(f"balanced recommended a plan {slow:.2f}x slower than the fastest (limit {limit}x)")
        if (not rec["tight"] and rec["device_peak_high_bytes"] > d["gpu"]["memory_bytes"]
                and d["margin"]["kind"] == "band"):
            out.append("recommended beyond the usable memory at the upper band without being marked tight")
    return out
