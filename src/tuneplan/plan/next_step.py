"""The next step for a setup that does not fit: its largest component, and one change that makes it fit.

Computed from estimates, never guessed. For an estimate that does not fit its card (memory, not a
compatibility error):
1. the largest memory component of its device peak (what the user would have to shrink);
2. the first change, in this order, whose own estimate fits (``Estimate.fits``), all else as given;
   the order puts first what keeps the data and the speed, last what costs the most time:
   - another framework, when the user did not set one (``setup.sources``): the frameworks whose
     estimate fits, the one with the lowest device peak;
   - gradient checkpointing, when it is off: the same data at about a third more compute (the forward
     runs again in backward);
   - a shorter sequence: the longest that fits (memory never falls as the sequence grows, so the
     boundary is found by bisection);
   - a smaller micro-batch: the largest that fits;
   - CPU offload under DeepSpeed ZeRO or FSDP: the optimizer states first, then the parameters too
     (``OFFLOAD_STEPS``); the step then waits on the host (often several times slower).
The change is data (``{"field", "from", "to", "device_peak_bytes"}``); each face words it (the CLI as a
flag, the web page as its field label).
"""

from __future__ import annotations

from typing import Any

from tuneplan.plan.search import largest_true

SEARCH_ORDER = ("framework", "gradient_checkpointing", "seq", "batch", "offload")
# Offload settings tried in order, each only where the setup's validation accepts it (ZeRO-2/3 or FSDP for
# the optimizer, ZeRO-3 or FSDP for everything): DeepSpeed's offload_optimizer then offload_param, FSDP's
# CPUOffload (which moves parameters and gradients with the optimizer step).
OFFLOAD_STEPS = ("optimizer", "all")


def given_fields(est: Any) -> dict[str, Any]:
    """The setup fields the user set (sources "flag" / "given" / a file's), not those a profile filled."""
    s = est.setup
    return {k: getattr(s, k) for k, v in s.sources.items() if "default" not in str(v)}


def next_step(est: Any) -> dict[str, Any] | None:
    """The largest component and the one change that makes ``est`` fit (module docstring); None when it
    fits, has no card, or cannot run there whatever its memory."""
    from tuneplan.api import estimate
    from tuneplan.errors import TuneplanError
    from tuneplan.specs.setup import FRAMEWORKS

    if est.gpu is None or est.fits or any(f.level == "error" for f in est.findings):
        return None
    comps = dict(est.breakdown.components)
    largest = max(comps, key=lambda k: comps[k]) if comps else None
    fields = {**given_fields(est), "batch": est.setup.batch, "seq": est.setup.seq}

    def at(**change: Any) -> Any:
        try:
            e = estimate(est.model, gpu=est.gpu, timing=False, **{**fields, **change})
        except TuneplanError:
            return None
        return e if e.fits else None

    change: dict[str, Any] | None = None
    if "framework" not in fields:
        fits = [(e.breakdown.device_peak_bytes, fw, e) for fw in FRAMEWORKS
                if fw != est.setup.framework and (e := at(framework=fw)) is not None]
        if fits:
            peak, fw, _ = min(fits, key=lambda t: (t[0], t[1]))
            change = {"field": "framework", "from": est.setup.framework, "to": fw, "device_peak_bytes": peak}
    if change is None and est.setup.gradient_checkpointing is False:
        change = _switch(at, "gradient_checkpointing", False, True)
    for name in ("seq", "batch"):
        cur = fields[name]
        if change is not None or cur <= 1:
            continue
        def fits_at(v: int, n: str = name) -> bool:
            return at(**{n: v}) is not None

        best = largest_true(fits_at, 1, cur - 1)
        if best:
            peak = at(**{name: best}).breakdown.device_peak_bytes
            change = {"field": name, "from": cur, "to": best, "device_peak_bytes": peak}
    rank = OFFLOAD_STEPS.index(est.setup.offload) if est.setup.offload in OFFLOAD_STEPS else -1
    for offload in OFFLOAD_STEPS[rank + 1:]:
        if change is None:
            change = _switch(at, "offload", est.setup.offload, offload)
    return {"largest_component": largest, "largest_component_bytes": comps.get(largest) if largest else None,
            "short_by_bytes": -(est.headroom_bytes or 0), "change": change}


def _switch(at: Any, field: str, current: Any, to: Any) -> dict[str, Any] | None:
    """The change ``field``: ``current`` -> ``to`` when its estimate (``at``) fits, else None."""
    fitted = at(**{field: to})
    if fitted is None:
        return None
    peak = fitted.breakdown.device_peak_bytes
    return {"field": field, "from": current, "to": to, "device_peak_bytes": peak}
