"""`fit`'s next step when nothing fits: what is largest, and the one change that makes something fit.

Nothing fits means no family of the candidate space (every method asked for, strategy, offload,
optimizer, checkpointing) runs even micro-batch 1 without accumulation on this card, margin aside. The
answer is computed from estimates, like ``plan/next_step.py`` for `estimate`:

- the reference: the most memory-sparing family that can run (``evaluate.sparing``): one that fits
  the card but not the host memory if any (then the host is what is short), else the one with the
  lowest device peak, whose largest memory component is what would have to shrink;
- the change, the first of these under which some family fits at micro-batch 1, all else as given:
  a shorter sequence (the longest that fits: memory never falls as the sequence grows, so bisection
  finds the boundary), more host memory (what the fitting offload family needs, in whole GiB), another
  method when the user pinned one (the most faithful that fits, ``rule.FAITHFUL``), more GPUs per node
  (the fewest of :data:`NODE_GPUS` that fits).
The change is data; each face words it (the CLI as a flag).
"""

from __future__ import annotations

from typing import Any

from tuneplan.estimator.types import GIB
from tuneplan.plan import rule
from tuneplan.plan.evaluate import Prober, first_fitting, sparing
from tuneplan.plan.search import largest_true
from tuneplan.plan.space import METHOD_VARIANTS, Family, families, strategy_name

# GPUs per node tried: the sizes nodes come in (HGX / DGX baseboards carry 8 SXM GPUs; workstations and
# cloud instances 2 or 4); beyond one node is `tuneplan gpus`' search.
NODE_GPUS = (2, 4, 8)

Variants = list[tuple[str, dict[str, Any]]]


def _fits_with(probe: Prober, variants: Variants, world: int, *, host: int | None = None,
               **changes: Any) -> tuple[Family, Any] | None:
    """The first family (``evaluate.first_fitting``) that fits at micro-batch 1 with ``changes``."""
    base = {**probe.base, **changes}
    p = Prober(probe.model, probe.gpu, base, host_bytes=host if host is not None else probe.host_bytes,
               shared=probe.shared)
    fams = families(variants, base, world, probe.gpu)
    return first_fitting(p, fams, lambda f: not p.compat_errors(f))


def _reference(probe: Prober, variants: Variants, world: int) -> tuple[Family, Any, str] | None:
    """The most sparing family that can run with its estimate at micro-batch 1, and what it is short of
    ("host" or "device")."""
    space = families(variants, probe.base, world, probe.gpu)
    live = [f for f in sparing(space) if not probe.compat_errors(f)]
    ests = [(f, e) for f in live if (e := probe({**f.as_fields, "batch": 1, "grad_accum": 1})) is not None]
    if not ests:
        return None
    on_card = [fe for fe in ests if fe[1].fits]  # the device holds it: the host memory is what is short
    if on_card:
        f, e = min(on_card, key=lambda fe: fe[1].breakdown.host_bytes)
        return f, e, "host"
    f, e = min(ests, key=lambda fe: fe[1].breakdown.device_needed_bytes)
    return f, e, "device"


def _change(probe: Prober, variants: Variants, world: int, pinned_method: bool,
            short: tuple[Family, Any, str]) -> dict[str, Any] | None:
    _, ref, what = short
    seq = int(ref.setup.seq)

    def found(s: int) -> tuple[Family, Any] | None:
        return _fits_with(probe, variants, world, seq=s)

    best = largest_true(lambda s: found(s) is not None, 1, seq - 1) if seq > 1 else None
    if best:
        return _worded("seq", seq, best, found(best))
    if what == "host":
        need = -(-ref.breakdown.host_bytes * ref.setup.gpus // GIB)  # whole GiB, all GPUs of the node
        got = _fits_with(probe, variants, world, host=need * GIB)
        if got is not None:
            return _worded("host_memory", probe.host_bytes / GIB, need, got)
    if pinned_method:
        asked = {label for label, _ in variants}
        for label in sorted((lb for lb, _ in METHOD_VARIANTS if lb not in asked), key=rule.faithful_rank):
            other = [v for v in METHOD_VARIANTS if v[0] == label]
            if (got := _fits_with(probe, other, world)) is not None:
                return _worded("method", "/".join(sorted(asked, key=rule.faithful_rank)), label, got)
    gpus = int(probe.base.get("gpus", 1))
    nodes = int(probe.base.get("nodes", 1))
    for n in (g for g in NODE_GPUS if g > gpus):
        if (got := _fits_with(probe, variants, n * nodes, gpus=n)) is not None:
            return _worded("gpus", gpus, n, got)
    return None


def _worded(name: str, old: Any, new: Any, got: tuple[Family, Any] | None) -> dict[str, Any]:
    assert got is not None  # each caller found a family that fits with the change
    fam, est = got
    return {"field": name, "from": old, "to": new, "method": fam.method, "strategy": strategy_name(est.setup),
            "device_peak_bytes": est.breakdown.device_peak_bytes}


def fit_next_step(probe: Prober, variants: Variants, world: int, *,
                  pinned_method: bool) -> dict[str, Any] | None:
    """The next step (module docstring); None when no family of the space can run at all (then each
    method's row says why)."""
    short = _reference(probe, variants, world)
    if short is None:
        return None
    fam, ref, what = short
    # short of host memory, no device component is to blame: the host holds the offloaded states
    comps = dict(ref.breakdown.components) if what == "device" else {}
    largest = max(comps, key=lambda k: comps[k]) if comps else None
    short_by = (ref.breakdown.host_bytes * ref.setup.gpus - probe.host_bytes if what == "host"
                else -ref.headroom_bytes)
    return {"largest_component": largest, "largest_component_bytes": comps.get(largest) if largest else None,
            "short_of": what, "short_by_bytes": short_by, "method": fam.method,
            "strategy": strategy_name(ref.setup),
            "change": _change(probe, variants, world, pinned_method, short)}
