"""Accuracy of tuneplan's memory estimate against measured runs that others published.

    python benchmarks/accuracy.py [--engine analytic|simulate] [--json] [--rows]

Reads benchmarks/data/calibration/measured.csv as it is (runs others published, copied verbatim),
maps each row to a setup (benchmarks/calibration_rows.py), predicts the quantity the row measured
(allocated, reserved or device memory) and prints, per framework, per method and overall: count,
median and p90 of the absolute relative error, the signed bias (median of signed errors), and how the
OOM rows are called. Unmapped rows are listed with the reason.

Scoring rules where the row alone does not say (the calibration data's scoring notes):
- a row below its own physical floor (the resident weights, quantization metadata, adapters and optimizer
  states its stated setup must hold per GPU, whatever the framework does) cannot have been measured as
  described: it is listed apart with the floor and the published value, and left out of the scored
  figures and of the "wrongly called out of memory" count. The test is the floor alone;
- a row whose metric is not stated is scored against the band [allocated peak, device peak]: error 0
  inside it, else the distance to the nearer end relative to the published value;
- a row whose stated length is the measured batch's (every sample padded or packed to it, or the longest
  sample forced into the measured batch: calibration_rows.stated_length) also holds the checkpointed
  layer inputs of batch x length in its floor: one hidden-state tensor per decoder layer, in the compute
  dtype, is what the backward needs whatever is recomputed (transformers' / torchtune's / LitGPT's
  checkpointing keeps each layer's input; none with activation offloading, whose saved tensors sit on the
  host);
- a row whose stated length is a truncation limit (dynamic padding, the data's lengths not given) has an
  unknown length: it is scored against the band from the estimate at a plausible shorter length (the
  longest sample of its default data where a row states it, else half the bound:
  calibration_rows.shorter_length) to the estimate at the bound (its stated quantity at both ends; allocated
  at the shorter length to device at the bound where the metric is not stated either), and the run prints
  how many rows were;
- every other row is scored against the quantity it states.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_rows import MappedRow, Unmapped, load_rows, map_row, pct, resolve_semantic_targets  # noqa: E402
from tuneplan.api import estimate  # noqa: E402
from tuneplan.catalog.models import resolve_model  # noqa: E402
from tuneplan.errors import TuneplanError  # noqa: E402

SCORED = ("high", "medium")
# What a setup holds per GPU whatever the framework does: resident weights (at the stated precision, quantized
# storage, sharded under ZeRO-3/FSDP, none when offloaded), their quantization metadata, the adapters, and the
# optimizer states of what it trains (none when offloaded or paged)
FLOOR_COMPONENTS = ("weights", "quant_meta", "lora_adapters", "optimizer_states")


def layer_inputs_bytes(spec: Any, setup: dict[str, Any]) -> int:
    """The checkpointed layer inputs batch x seq must hold per GPU: one (batch, seq, hidden) tensor per
    decoder layer in the compute dtype (0 with activation offloading: the saved tensors are on the host)."""
    from tuneplan.api import build_setup
    from tuneplan.estimator.run import resolve_run

    if setup.get("activation_offload"):
        return 0
    run = resolve_run(spec, build_setup(spec, **setup))
    return int(spec.n_layers * setup.get("batch", 1) * setup["seq"] * spec.hidden * run.dtypes.compute)


def predict(row: MappedRow, engine: str) -> dict[str, Any]:
    spec = resolve_model(row.model, allow_network=False)
    setup = dict(row.setup)
    if isinstance(setup.get("targets"), str) and setup["targets"].startswith("sem:"):
        setup["targets"] = resolve_semantic_targets(spec, setup["targets"])
    p = _predict_at(row, spec, setup, engine)
    if row.length_kind == "padded":
        p["floor_bytes"] += layer_inputs_bytes(spec, setup)
    if row.length_kind == "bound" and row.shorter_seq:
        short = _predict_at(row, spec, {**setup, "seq": row.shorter_seq}, engine)
        p.update(short_predicted_bytes=short["predicted_bytes"],
                 short_allocated_bytes=short["allocated_bytes"])
    return p


def _predict_at(row: MappedRow, spec: Any, setup: dict[str, Any], engine: str) -> dict[str, Any]:
    """The estimate's quantities for the row's setup (the length as given in ``setup``)."""
    est = estimate(spec, gpu=row.gpu, engine=engine, **setup)
    b = est.breakdown
    device = b.device_peak_bytes
    if row.context_bytes is not None:
        # The source states the CUDA context its NVML reading includes (e.g. ~1343 MB on its V100 stack,
        # without lazy module loading): compare with that context, not tuneplan's modern-stack default.
        device += row.context_bytes - b.cuda_context_bytes
    quantity = {"allocated": b.allocated_peak_bytes, "reserved": b.reserved_peak_bytes,
                "device": device}.get(row.metric, b.allocated_peak_bytes)
    floor = sum(b.components.get(k, 0) for k in FLOOR_COMPONENTS)
    if row.metric == "reserved" and row.reserved_floor_bytes:
        # the run reserved this much while loading the model (torchtune 0.1 builds the NF4 weights on the GPU)
        # and the caching allocator kept it: tuneplan estimates the training step, not the load
        quantity = max(quantity, row.reserved_floor_bytes)
    return {"predicted_bytes": quantity, "allocated_bytes": b.allocated_peak_bytes,
            "reserved_bytes": b.reserved_peak_bytes, "device_bytes": device,
            "floor_bytes": floor, "fits": est.fits, "gpu_bytes": est.gpu.memory_bytes if est.gpu else None}


def below_floor(measured_bytes: int, floor_bytes: int) -> bool:
    """A published peak under what the stated setup must hold per GPU (weights + optimizer states)."""
    return measured_bytes < floor_bytes


def score(measured_bytes: int, metric: str, predicted_bytes: int, allocated_bytes: int,
          device_bytes: int, short: tuple[int, int] | None = None) -> tuple[float, str]:
    """Signed relative error of a measured row and how it was scored ("stated", "band" or "length band").

    A row with no stated metric is scored against [allocated, device]: 0 inside the band, else
    (nearer end - measured) / measured, so an estimate whose device peak is below the published value
    is negative and one whose allocated peak is above it positive. ``short`` (a row whose length is a
    truncation limit: the (stated quantity, allocated) estimated at the shorter length) widens the band
    down to the shorter length's estimate: [stated quantity at the shorter length, at the bound], or
    [allocated at the shorter length, device at the bound] with no stated metric."""
    if short is not None:
        lo = short[1] if metric == "unknown" else short[0]
        hi = device_bytes if metric == "unknown" else predicted_bytes
        return _band_error(measured_bytes, lo, hi), "length band"
    if metric != "unknown":
        return (predicted_bytes - measured_bytes) / measured_bytes, "stated"
    return _band_error(measured_bytes, allocated_bytes, device_bytes), "band"


def _band_error(measured: int, a: int, b: int) -> float:
    """0 inside [min(a, b), max(a, b)], else (nearer end - measured) / measured."""
    lo, hi = min(a, b), max(a, b)
    if measured < lo:
        return (lo - measured) / measured
    if measured > hi:
        return (hi - measured) / measured
    return 0.0


def run(engine: str = "analytic") -> dict[str, Any]:
    results, unmapped, oom, floor_rows = [], [], [], []
    for raw in load_rows():
        m = map_row(raw)
        if isinstance(m, Unmapped):
            unmapped.append({"row_id": m.row_id, "source": m.source_group, "reason": m.reason})
            continue
        try:
            p = predict(m, engine)
        except TuneplanError as exc:
            unmapped.append({"row_id": m.row_id, "source": m.source_group, "reason": str(exc)})
            continue
        base = {"row_id": m.row_id, "framework": m.framework, "method": m.setup["method"], "metric": m.metric,
                "gpus": m.setup.get("gpus", 1),
                "confidence": m.confidence, "model": m.model, "approximations": m.approximations, **p}
        if m.outcome == "OOM":
            budget = p["gpu_bytes"]
            called = None if budget is None else p["device_bytes"] > budget
            oom.append({**base, "called_oom": called})
        elif m.outcome == "max_seq_len_that_fits":
            if m.budget_bytes:
                oom.append({**base, "kind": "max_seq", "budget_bytes": m.budget_bytes,
                            "fits_budget": p["device_bytes"] <= m.budget_bytes})
            else:
                unmapped.append({"row_id": m.row_id, "source": m.source_group, "reason": "no VRAM budget"})
        elif m.measured_bytes and below_floor(m.measured_bytes, p["floor_bytes"]):
            floor_rows.append({**base, "measured_bytes": m.measured_bytes})
        elif m.measured_bytes:
            short = ((p["short_predicted_bytes"], p["short_allocated_bytes"]) if "short_predicted_bytes" in p
                     else None)
            err, how = score(m.measured_bytes, m.metric, p["predicted_bytes"], p["allocated_bytes"],
                             p["device_bytes"], short)
            results.append({**base, "measured_bytes": m.measured_bytes, "rel_error": err, "scored_as": how,
                            "false_oom": p["fits"] is False})
        else:
            unmapped.append({"row_id": m.row_id, "source": m.source_group, "reason": "no memory value"})
    return {"engine": engine, "rows": results, "oom_rows": oom, "below_floor": floor_rows,
            "unmapped": unmapped, "summary": summarize(results, oom, floor_rows)}


def _stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [abs(r["rel_error"]) for r in rows]
    signed = [r["rel_error"] for r in rows]
    return {"count": len(rows), "median_abs": statistics.median(errs) if errs else None,
            "p90_abs": pct(errs, 0.9) if errs else None,
            "bias": statistics.median(signed) if signed else None}


def summarize(results: list[dict[str, Any]], oom: list[dict[str, Any]],
              floor_rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    scored = [r for r in results if r["confidence"] in SCORED]
    multi = [r for r in scored if r.get("gpus", 1) > 1]
    by_fw: dict[str, list] = defaultdict(list)
    by_method: dict[str, list] = defaultdict(list)
    for r in scored:
        by_fw[r["framework"]].append(r)
        by_method[r["method"]].append(r)
    real_oom = [r for r in oom if r.get("kind") != "max_seq"]
    called = [r for r in real_oom if r["called_oom"]]
    unknown = [r for r in real_oom if r["called_oom"] is None]
    maxseq = [r for r in oom if r.get("kind") == "max_seq"]
    return {
        "overall": _stats(scored),
        "multi_gpu": _stats(multi),
        "scored_stated": sum(1 for r in scored if r.get("scored_as") == "stated"),
        "scored_band": sum(1 for r in scored if r.get("scored_as") == "band"),
        "scored_length_band": sum(1 for r in scored if r.get("scored_as") == "length band"),
        "below_floor": len(floor_rows or []),
        "all_confidence": _stats(results),
        "by_framework": {k: _stats(v) for k, v in sorted(by_fw.items())},
        "by_method": {k: _stats(v) for k, v in sorted(by_method.items())},
        "oom_rows": len(real_oom), "oom_called": len(called), "oom_gpu_unknown": len(unknown),
        "false_oom_on_measured_rows": sum(1 for r in results if r["false_oom"]),
        "max_seq_rows": len(maxseq), "max_seq_consistent": sum(1 for r in maxseq if r["fits_budget"]),
    }


def fmt(s: dict[str, Any]) -> str:
    if not s["count"]:
        return "n=0"
    return (f"n={s['count']:3d}  median {100 * s['median_abs']:5.1f}%  p90 {100 * s['p90_abs']:5.1f}%  "
            f"bias {100 * s['bias']:+5.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="analytic", choices=["analytic", "simulate"])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rows", action="store_true", help="print every row")
    a = ap.parse_args()
    out = run(a.engine)
    if a.json:
        print(json.dumps(out, indent=1, default=str))
        return
    s = out["summary"]
    print(f"engine: {out['engine']}   (scored rows: config_confidence high/medium)")
    print(f"overall            {fmt(s['overall'])}")
    print(f"multi-GPU rows     {fmt(s['multi_gpu'])}")
    print(f"scored rows: {s['scored_stated']} against their stated metric, {s['scored_band']} against the "
          f"[allocated, device] band (metric not stated), {s['scored_length_band']} against the band from a "
          f"plausible shorter length to the stated one (a truncation limit); {s['below_floor']} below their "
          "physical floor, listed apart")
    print(f"all confidences    {fmt(s['all_confidence'])}")
    for k, v in s["by_framework"].items():
        print(f"framework {k:9s} {fmt(v)}")
    for k, v in s["by_method"].items():
        print(f"method {k:12s} {fmt(v)}")
    print(f"OOM rows called out of memory: {s['oom_called']}/{s['oom_rows']} "
          f"({s['oom_gpu_unknown']} with the GPU not stated)")
    print(f"measured rows wrongly called out of memory: {s['false_oom_on_measured_rows']}")
    print(f"max-seq rows whose seq fits the stated budget: {s['max_seq_consistent']}/{s['max_seq_rows']}")
    if a.rows:
        for r in sorted(out["rows"], key=lambda r: -abs(r["rel_error"])):
            print(f"  {r['row_id']} {r['framework']:9s} {r['method']:5s} {r['metric']:9s} "
                  f"{r['confidence']:6s} {r['model'][:34]:34s} meas {r['measured_bytes'] / 2**30:7.2f} pred "
                  f"{r['predicted_bytes'] / 2**30:7.2f} GiB  {100 * r['rel_error']:+6.1f}%")
        for r in out["oom_rows"]:
            print(f"  OOM {r['row_id']} {r['framework']} {r['model'][:30]} "
                  f"device {r['device_bytes'] / 2**30:.1f} GiB gpu {(r.get('gpu_bytes') or 0) / 2**30:.1f} "
                  f"called={r.get('called_oom', r.get('fits_budget'))}")
    if out["below_floor"]:
        print("rows below their own physical floor (weights + quantization metadata + adapters + optimizer "
              "states per GPU, + the checkpointed layer inputs where every sample has the stated length): "
              "not scored")
    for r in out["below_floor"]:
        print(f"  {r['row_id']} {r['framework']:9s} {r['method']:5s} {r['model'][:34]:34s} published "
              f"{r['measured_bytes'] / 2**30:7.2f} GiB < floor {r['floor_bytes'] / 2**30:7.2f} GiB")
    print(f"unmapped rows: {len(out['unmapped'])}")
    for u in out["unmapped"]:
        print(f"  {u['row_id']} {u['source']}: {u['reason']}")


if __name__ == "__main__":
    main()
