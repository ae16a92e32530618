"""tuneplan's step time against Answer.AI's published, timed fsdp_qlora runs (a held-out set).

    python benchmarks/fsdp_qlora_time.py [--rows] [--json] [--calibrated]

The rows (benchmarks/data/fsdp_qlora_timed_runs.csv) are the 33 "Time (s)" figures of "Benchmarking
QLoRA+FSDP" (benchmarks_03_2024.md in github.com/AnswerDotAI/fsdp_qlora, measured February-March 2024):
two RTX 3090 (no NVLink, an older board) and two RTX 4090 (PCIe 4.0 x16, no NVLink) with Llama-2 7B / 70B,
Yi 34B and Mistral 7B v0.2, FSDP with and without CPU offload, QLoRA and LoRA; and the post's cloud table
(Llama-2 70B QLoRA on 2-8 A5000, RTX 6000 Ada, A100 40GB SXM and H100 SXM).

What a row's time is, from train.py (05ed9f2): CUDA events around the training loop only (model loading
and quantization are outside), over ``--dataset dummy --dataset_samples 1024``: every sample is the
context length (its output is twice as long and truncated); the dataset is cut to a multiple of
``batch_size x gradient_accumulation_steps``, split over the ranks by a DistributedSampler (padded to a
multiple of the world size) and batched without dropping the last batch. So each rank runs
``ceil(ceil(N' / gpus) / batch)`` micro-batches, ``N' = 1024 - 1024 mod (batch x grad_accum)``, and the
predicted time is micro-batches / grad_accum optimizer steps of tuneplan's step time.

The case-study rows use train.py's defaults (gradient_accumulation_steps 1); the cloud table says it aimed
at an effective batch of 32, so grad_accum = 32 / (batch x gpus) (36 for 4 x 3 on the RTX 6000 Ada).
``ddp`` rows are FSDP NO_SHARD, estimated as DDP. The 2 x A5000 row also offloaded activations, which
tuneplan does not model (so it is predicted too fast there).

The 3090 rig is "an older motherboard" with "slow PCI lanes", set against the 4090 workstation's "full
PCIe v4 x16 lanes": its rows state the link a user of that board would give, ``--link pcie3x8`` (PCIe
3.0, one x16 slot split x8/x8 for two cards); ``--catalog-link`` scores them on the catalog's PCIe 4.0 x16.

These rows are never used to set a constant: they are the check of the time model on runs it was not
built on. Error = predicted seconds / published seconds - 1 (negative: predicted too fast).

``--calibrated`` checks the per-machine calibration (``tuneplan calibration add``) the way a user meets
it: each run in turn is recorded as the card's only measured step (in a throwaway store, never the
user's), then every other run of the same card and model is predicted, with and without that record.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_rows import pct  # noqa: E402
from tuneplan.api import estimate  # noqa: E402
from tuneplan.catalog.models import resolve_model  # noqa: E402
from tuneplan.estimator.throughput import RuntimeOptions  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "fsdp_qlora_timed_runs.csv"
SAMPLES = 1024
SMALL_TOKENS = 4096  # tokens per micro-batch per GPU at or below which a step counts as "small"


def load() -> list[dict[str, str]]:
    with DATA.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def setup_of(row: dict[str, str]) -> dict[str, Any]:
    """The tuneplan fields of the post's template command with the row's changes."""
    kw: dict[str, Any] = {"framework": "fsdp-qlora", "method": row["train_type"], "gpus": int(row["gpus"]),
                          "batch": int(row["batch_size"]), "seq": int(row["context_length"]),
                          "grad_accum": int(row["grad_accum"]), "gradient_checkpointing": True}
    if row["sharding_strategy"] == "full_shard":
        kw["fsdp"] = True
        kw["offload"] = "all" if row["cpu_offload"] == "true" else "none"
    return kw


def micro_batches(batch: int, grad_accum: int, gpus: int) -> int:
    """Micro-batches each rank runs over train.py's dummy data set (see the module doc)."""
    kept = SAMPLES - SAMPLES % (batch * grad_accum)
    return math.ceil(math.ceil(kept / gpus) / batch)


def regimes(row: dict[str, str]) -> list[str]:
    tokens = int(row["batch_size"]) * int(row["context_length"])
    out = ["small steps" if tokens <= SMALL_TOKENS else "large steps",
           "offload" if row["cpu_offload"] == "true" else "no offload",
           "consumer (3090/4090)" if row["gpu"] in ("rtx-3090", "rtx-4090") else "cloud cards",
           row["train_type"]]
    return out


def predict(row: dict[str, str], catalog_link: bool = False) -> dict[str, Any]:
    kw = setup_of(row)
    link = None if catalog_link else row["stated_link"] or None
    est = estimate(resolve_model(row["model_id"], allow_network=False), gpu=row["gpu"],
                   time_options=RuntimeOptions(peer_link=link), **kw)
    t = est.extras["sections"]["time"]
    micro = micro_batches(kw["batch"], kw["grad_accum"], kw["gpus"])
    steps = micro / kw["grad_accum"]
    predicted = steps * t["step_seconds"]
    band = t.get("band") or {}
    published = float(row["time_s"])
    out = {"row_id": row["row_id"], "gpu": row["gpu"], "gpus": kw["gpus"], "model": row["model_as_published"],
           "train_type": row["train_type"], "sharding": row["sharding_strategy"],
           "cpu_offload": row["cpu_offload"] == "true", "batch": kw["batch"], "seq": kw["seq"],
           "micro_batches": micro, "published_s": published, "predicted_s": predicted,
           "rel_error": predicted / published - 1.0, "regimes": regimes(row),
           "breakdown": {k: v * steps for k, v in t["breakdown"].items()}}
    if band.get("step_seconds_high"):
        out["high_s"] = steps * band["step_seconds_high"]
        out["low_s"] = steps * band["step_seconds_low"]
    return out


def stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [abs(r["rel_error"]) for r in rows]
    return {"count": len(rows), "median_abs": statistics.median(errs) if errs else None,
            "p90_abs": pct(errs, 0.9) if errs else None,
            "bias": statistics.median(r["rel_error"] for r in rows) if rows else None,
            "inside_band": sum(1 for r in rows
                               if "high_s" in r and r["low_s"] <= r["published_s"] <= r["high_s"])}


def run(only: tuple[str, ...] = (), catalog_link: bool = False) -> dict[str, Any]:
    rows = [predict(r, catalog_link) for r in load() if not only or r["row_id"] in only]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        for g in r["regimes"]:
            groups.setdefault(g, []).append(r)
    return {"rows": rows, "summary": {"all": stats(rows), **{g: stats(v) for g, v in sorted(groups.items())}}}


@contextmanager
def store_in(folder: str) -> Iterator[None]:
    """The calibration store of the estimates in the block lives in ``folder`` (not the user's)."""
    from tuneplan.estimator.step_calibration import forget

    old = os.environ.get("TUNEPLAN_CONFIG_DIR")
    os.environ["TUNEPLAN_CONFIG_DIR"] = folder
    forget()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TUNEPLAN_CONFIG_DIR", None)
        else:
            os.environ["TUNEPLAN_CONFIG_DIR"] = old
        forget()


def record(row: dict[str, str], catalog_link: bool) -> None:
    """``row``'s measured step (published seconds / optimizer steps) into the current store, with the
    link the row states, as ``tuneplan calibration add --link`` would record it."""
    from tuneplan.measure.calibration import record_step

    kw = setup_of(row)
    link = None if catalog_link else row["stated_link"] or None
    est = estimate(resolve_model(row["model_id"], allow_network=False), gpu=row["gpu"], timing=False, **kw)
    steps = micro_batches(kw["batch"], kw["grad_accum"], kw["gpus"]) / kw["grad_accum"]
    record_step(est.run, est.gpu, float(row["time_s"]) / steps, "held-out run",
                options=RuntimeOptions(peer_link=link))


def calibrated_pairs(catalog_link: bool = False) -> dict[str, Any]:
    """Each run recorded alone, every other run of the same card and model predicted: per ordered pair
    the error before (an empty store) and after the record."""
    rows = load()
    pairs = []
    with tempfile.TemporaryDirectory() as empty, store_in(empty):
        before = {r["row_id"]: predict(r, catalog_link)["rel_error"] for r in rows}
    for a in rows:
        others = [b for b in rows if b is not a and (b["gpu"], b["model_id"]) == (a["gpu"], a["model_id"])]
        if not others:
            continue
        with tempfile.TemporaryDirectory() as folder, store_in(folder):
            record(a, catalog_link)
            pairs += [{"recorded": a["row_id"], "predicted": b["row_id"], "before": before[b["row_id"]],
                       "after": predict(b, catalog_link)["rel_error"]} for b in others]
    summary = {}
    for key in ("before", "after"):
        errs = [abs(p[key]) for p in pairs]
        summary[key] = {"count": len(errs), "median_abs": statistics.median(errs), "p90_abs": pct(errs, 0.9),
                        "max_abs": max(errs)}
    return {"pairs": pairs, "summary": summary}


def _fmt(name: str, s: dict[str, Any]) -> str:
    if not s["count"]:
        return f"{name:24} n=0"
    return (f"{name:24} n={s['count']:2d}  median |err| {100 * s['median_abs']:5.1f}%  "
            f"p90 {100 * s['p90_abs']:5.1f}%  median signed {100 * s['bias']:+5.1f}%  "
            f"inside the band {s['inside_band']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--rows", action="store_true", help="print every row")
    ap.add_argument("--catalog-link", action="store_true", help="ignore the links the rows state")
    ap.add_argument("--calibrated", action="store_true",
                    help="each run recorded as the card's calibration, the others of its card and model "
                    "predicted")
    a = ap.parse_args()
    if a.calibrated:
        cal = calibrated_pairs(a.catalog_link)
        if a.json:
            print(json.dumps(cal, indent=1))
            return
        print("held-out, calibrated on one other run of the same card and model (ordered pairs); "
              "error = predicted / published - 1")
        for key, s in cal["summary"].items():
            print(f"{key + ' the record':18} n={s['count']:3d}  median |err| {100 * s['median_abs']:5.1f}%  "
                  f"p90 {100 * s['p90_abs']:5.1f}%  max {100 * s['max_abs']:5.1f}%")
        return
    with tempfile.TemporaryDirectory() as empty, store_in(empty):  # never this machine's calibration
        res = run(catalog_link=a.catalog_link)
    if a.json:
        print(json.dumps(res, indent=1))
        return
    if a.rows:
        print(f"{'row':5} {'gpu':24} {'n':>1} {'model':12} {'type':5} {'shard':9} {'off':3} {'B':>2} "
              f"{'S':>5} {'published':>9} {'predicted':>9} {'error':>7}  band")
        for r in res["rows"]:
            band = f"{r['low_s']:7.0f}-{r['high_s']:<7.0f}" if "high_s" in r else ""
            print(f"{r['row_id']:5} {r['gpu']:24} {r['gpus']:1d} {r['model'][:12]:12} {r['train_type']:5} "
                  f"{r['sharding']:9} {'yes' if r['cpu_offload'] else 'no':3} {r['batch']:2d} {r['seq']:5d} "
                  f"{r['published_s']:9.0f} {r['predicted_s']:9.0f} {100 * r['rel_error']:+6.1f}%  {band}")
        print()
    print("held-out: Answer.AI fsdp_qlora timed runs (seconds for 1,024 samples); "
          "error = predicted / published - 1")
    for name, s in res["summary"].items():
        print(_fmt(name, s))


if __name__ == "__main__":
    main()
