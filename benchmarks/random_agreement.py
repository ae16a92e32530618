"""The analytic engine against the simulation on random valid setups (``agreement.py --random N``).

``run(draws, jobs)`` simulates each draw of ``random_setups.sample`` in worker processes (each worker runs
many draws: the imports of torch, transformers and PEFT dominate a small simulation) and returns one
record per draw: the two allocated peaks and their relative difference, or ``skipped`` with the
simulation's own reason. ``summarize`` gives the share within 3 %, the worst cases and, per axis (method,
strategy, world size, offload, framework, precision, optimizer, attention, checkpointing, quantization,
targets, model family, depth...), the count, the share within 3 % and the largest difference of each value.
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from random_setups import Draw  # noqa: E402

WITHIN = 0.03
FAR = 0.10
# the reserved peaks are compared too (the analytic segment model against simulate's allocator emulation)
RESERVED_WITHIN = 0.05
# draws per worker process before it is replaced: amortizes the imports, bounds what a long-lived
# fake-tensor process accumulates
DRAWS_PER_WORKER = 25


def run_draw(d: Draw) -> dict[str, Any]:
    """Both engines on one draw (a record with ``skipped`` where the simulation cannot run it)."""
    from agreement import Case, run_case
    from tuneplan.errors import TuneplanError

    try:
        r = run_case(Case(d.label, d.model, d.setup, layers=d.layers), skip_unsupported=True)
    except TuneplanError as exc:  # the simulation refused the model (no transformers class for it...)
        r = {"label": d.label, "skipped": str(exc).split(" (")[0]}
    except Exception as exc:  # a failure of either engine is a finding, reported with the draw
        first = (str(exc).splitlines() or [""])[0][:200]
        r = {"label": d.label, "error": f"{type(exc).__name__}: {first}"}
    r["axes"] = axes(d)
    r["draw"] = {"model": d.model, "layers": d.layers, "setup": d.setup}
    return r


def axes(d: Draw) -> dict[str, str]:
    """The values of one draw along each axis the report groups by."""
    s = d.setup
    strat = (f"zero{s['zero']}" if s.get("zero") else f"fsdp{s.get('fsdp_version', 1)}" if s.get("fsdp")
             else "ddp" if s.get("gpus", 1) > 1 else "one GPU")
    dq = " dq" if s.get("double_quant", True) else ""
    quant = f"{s.get('bits', 4)}-bit {s.get('quant_type', 'nf4')}{dq}" if s["method"] == "qlora" else "none"
    lora = s["method"] in ("lora", "qlora")
    gc = s.get("gradient_checkpointing")
    return {"method": s["method"], "strategy": strat, "world size": str(s.get("gpus", 1)),
            "offload": s.get("offload", "none"), "framework": s.get("framework", "hf"),
            "precision": s.get("precision", "bf16-mixed"), "optimizer": s.get("optimizer", "profile default"),
            "attention": s.get("attn", "profile default"),
            "checkpointing": "profile default" if gc is None else ("on" if gc else "off"),
            "quantization": quant, "targets": s.get("targets", "profile default") if lora else "-",
            "model": d.model.split("/")[-1], "depth": str(d.layers),
            "batch x seq": f"{s['batch']}x{s['seq']}" if s["batch"] * s["seq"] < 2048 else ">= 2048 tokens",
            "grad accum": str(s.get("grad_accum", 1)), "head": "classifier" if s.get("num_labels") else "LM"}


def run(draws: list[Draw], jobs: int = 2, each: Any = None) -> list[dict[str, Any]]:
    """Every draw through both engines, ``jobs`` worker processes; ``each(record)`` as each one is done."""
    out: list[dict[str, Any]] = []
    if jobs <= 1:
        for d in draws:
            out.append(run_draw(d))
            if each:
                each(out[-1])
        return out
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    # A fresh pool per chunk keeps each worker's memory bounded; ProcessPoolExecutor's own
    # max_tasks_per_child hung here once the workers were replaced (CPython 3.11: the executor waits on
    # futures of a worker that exited), after exactly jobs x DRAWS_PER_WORKER draws.
    chunk = jobs * DRAWS_PER_WORKER
    for start in range(0, len(draws), chunk):
        with ProcessPoolExecutor(jobs, mp_context=ctx) as ex:
            for fut in as_completed([ex.submit(run_draw, d) for d in draws[start:start + chunk]]):
                out.append(fut.result())
                if each:
                    each(out[-1])
    order = {d.label: i for i, d in enumerate(draws)}
    return sorted(out, key=lambda r: order[r["label"]])


def summarize(records: list[dict[str, Any]], worst: int = 10) -> dict[str, Any]:
    """Share within 3 %, the worst cases, per-axis concentration, and the skipped draws by reason."""
    compared = [r for r in records if "rel" in r]
    skipped = Counter(_reason(r["skipped"]) for r in records if "skipped" in r)
    errors = [r for r in records if "error" in r]
    rels = [abs(r["rel"]) for r in compared]
    per_axis: dict[str, dict[str, dict[str, Any]]] = {}
    groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in compared:
        for axis, value in r["axes"].items():
            groups[axis][value].append(abs(r["rel"]))
    for axis, values in groups.items():
        per_axis[axis] = {v: {"n": len(xs), "within": sum(x <= WITHIN for x in xs) / len(xs), "max": max(xs)}
                          for v, xs in sorted(values.items())}
    res = [abs(r["rel_reserved"]) for r in compared if "rel_reserved" in r]
    reserved = {"n": len(res), "within_5pct": sum(x <= RESERVED_WITHIN for x in res),
                "median_abs": statistics.median(res) if res else None, "max_abs": max(res) if res else None,
                "bias": statistics.median(r["rel_reserved"] for r in compared if "rel_reserved" in r) if res
                else None}
    return {"drawn": len(records), "compared": len(compared), "skipped": sum(skipped.values()),
            "reserved": reserved,
            "skipped_by_reason": dict(skipped.most_common()), "errors": len(errors),
            "within_3pct": sum(x <= WITHIN for x in rels), "beyond_10pct": sum(x > FAR for x in rels),
            "share_within_3pct": sum(x <= WITHIN for x in rels) / len(rels) if rels else None,
            "median_abs": statistics.median(rels) if rels else None, "max_abs": max(rels) if rels else None,
            "worst": sorted(compared, key=lambda r: -abs(r["rel"]))[:worst], "per_axis": per_axis,
            "error_records": errors}


def _reason(text: str) -> str:
    """The reason, cut to one line's length so that alike reasons are counted together."""
    return text if len(text) <= 160 else text[:157] + "..."


def report_lines(s: dict[str, Any]) -> list[str]:
    """The summary as text: totals, skips by reason, errors, worst cases, then where it concentrates."""
    lines = [f"random setups: {s['drawn']} drawn, {s['compared']} compared, {s['skipped']} skipped "
             f"(the simulation cannot run them), {s['errors']} failed"]
    if s["compared"]:
        share = 100 * s["share_within_3pct"]
        lines.append(f"within 3 %: {s['within_3pct']}/{s['compared']} ({share:.1f} %); "
                     f"beyond 10 %: {s['beyond_10pct']}; |peak diff| median {100 * s['median_abs']:.2f} %, "
                     f"max {100 * s['max_abs']:.2f} %")
    rv = s.get("reserved") or {}
    if rv.get("n"):
        lines.append(f"reserved peak (segment model vs allocator emulation): within 5 %: "
                     f"{rv['within_5pct']}/{rv['n']}; |diff| median {100 * rv['median_abs']:.2f} %, "
                     f"max {100 * rv['max_abs']:.2f} %, signed median {100 * rv['bias']:+.2f} %")
    for why, n in s["skipped_by_reason"].items():
        lines.append(f"  skipped {n:3d}: {why}")
    for r in s["error_records"]:
        lines.append(f"  failed: {r['label']}: {r['error']}")
    lines.append("worst cases (analytic vs simulate, allocated peak; largest component diff., % of peak):")
    for r in s["worst"]:
        comp = max(r["components"].items(), key=lambda kv: abs(kv[1]["diff_pct_of_peak"]))
        diff = comp[1]["diff_pct_of_peak"]
        lines.append(f"  {100 * r['rel']:+6.2f} %  {r['label']}  {comp[0]} {diff:+.1f} %  "
                     f"peak {r['sim_instant']} / {r['ana_instant']}")
    lines.append("per axis, the values with a case beyond 3 % (n, share within 3 %, largest |diff|):")
    for axis, values in s["per_axis"].items():
        off = [f"{v} n={x['n']} {100 * x['within']:.0f}% max {100 * x['max']:.1f}%" for v, x in values.items()
               if x["within"] < 1]
        if off:
            lines.append(f"  {axis}: " + "; ".join(off))
    return lines
