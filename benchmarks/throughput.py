"""Predicted training throughput against the published throughput and time rows of the calibration data.

    python benchmarks/throughput.py [--rows] [--json] [--a10g-tflops 70]

Reads benchmarks/data/calibration/measured.csv (else ../shared/calibration/measured.csv) as it is, maps each
row with a throughput or a time to a setup (benchmarks/calibration_rows.py, the accuracy benchmark's
mapper), predicts the seconds the row's work takes with ``tuneplan.estimator.throughput.step_time`` and
prints median and p90 of |relative error| of tokens/s (and the signed median) per framework, per method,
per GPU and overall. Rows it cannot score are listed with the reason.

What a row's "work" is, and the assumptions that go with it (printed with the results):
- litgpt resource tables (A100 40GB, 2023): 1,000 micro-batches of Alpaca, batches padded to their longest
  sample, the longest sample of the dataset forced into the first one, after the timed loop's sanity
  validation (100 forward micro-batches, 100 generated tokens);
- litgpt config hub (A10G, 2024): Alpaca2k, 2,000 samples less the config's validation split, epochs as
  published, samples truncated to 512 tokens, batches padded to their longest sample; Alpaca2k rows are
  1.87x as long as Alpaca's (the byte sizes of the two parquet files with the same columns); the timed
  ``fit`` also validates and generates an example every ``eval.interval`` steps (``LITGPT_EVAL``);
- torchtune / LLaMA-Factory tokens per second: tokens per GPU per second at the stated sequence length
  (packed rows are full; unpacked Alpaca rows count real tokens, computed on padded batches);
- transformers docs (BERT on V100): samples/s x 512 tokens.
Alpaca sample lengths (Llama-2 tokenizer): mean 140 tokens, from the dataset's byte size (47.8 MB for
52,002 rows of instruction/input/output/templated text: ~540 bytes of templated text per sample at ~3.9
bytes per token); log-normal with sigma 0.58, the value at which the longest of 51,759 samples is the
1,304 tokens litgpt reports. Other tokenizers scale by litgpt's longest-sample ratios (phi 1044, StableLM
1034, Falcon 1079 vs Llama-2 1304) or, for 128K+ vocabularies, by Meta's "up to 15% fewer tokens".
These are assumptions about the data the rows ran on, not fitted to the rows.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from statistics import NormalDist
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from calibration_rows import MappedRow, Unmapped, map_row, pct, resolve_semantic_targets  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.catalog.accelerators import resolve_accelerator  # noqa: E402
from tuneplan.catalog.models import resolve_model  # noqa: E402
from tuneplan.errors import TuneplanError  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402
from tuneplan.estimator.runtime import unverified_figures  # noqa: E402
from tuneplan.estimator.throughput import RuntimeOptions, UnknownThroughput, run_eval_time, run_step_time  # noqa: E402

LOCAL = HERE / "data" / "calibration" / "measured.csv"
# regimes printed apart, so none hides behind another: tokens per optimizer step per GPU at or below
# SMALL_STEP_TOKENS (where fixed costs rule), one card or several, CPU offload or not
SMALL_STEP_TOKENS = 4096
REGIMES = ("tokens per step", "cards", "offload")
SHARED = HERE.parent.parent / "shared" / "calibration" / "measured.csv"

ALPACA_MEAN_LLAMA2 = 140.0
ALPACA_SIGMA = 0.58
ALPACA_LONGEST_LLAMA2 = 1304
# Alpaca2k (mhenrichsen/alpaca_2k_test) samples are longer than Alpaca's: both are published as parquet with
# the same four columns (instruction, input, output, templated text), 1.76 MB for 2,000 rows (880 B a row)
# against 24.52 MB for 52,002 rows (471.6 B a row, the Alpaca split whose 47.8 MB gives the 140-token mean).
# Same columns, same snappy compression: Alpaca2k rows hold 880 / 471.6 = 1.87x the text.
ALPACA2K_LENGTH_RATIO = (1.76e6 / 2000) / (24_523_957 / 52_002)
ALPACA2K_SAMPLES = 2000
# litgpt's ``fit`` (finetune/lora.py, full.py, April-September 2024) is what the config hub's "Training
# runtime" times. Inside it: a sanity check of 2 validation micro-batches, then every ``eval.interval``
# optimizer steps ``validate`` (min(len(val_dataloader), eval.max_iters) forward-only micro-batches) and
# ``generate_example`` (eval.max_new_tokens tokens at batch 1 with a KV cache). The configs
# (config_hub/finetune/*.yaml at the table's commits) all set max_iters 100 and max_new_tokens 100; the
# interval and the validation split per config (blank split: Alpaca2k's default 0.05):
LITGPT_SANITY_ITERS = 2
LITGPT_EVAL_MAX_ITERS = 100
LITGPT_EVAL_NEW_TOKENS = 100
LITGPT_EVAL = {  # config: (eval.interval, val_split_fraction)
    "falcon-7b/lora.yaml": (100, 0.05), "falcon-7b/qlora.yaml": (100, 0.05),
    "gemma-2b/full.yaml": (25, 0.03847), "gemma-2b/lora.yaml": (25, 0.03847),
    "gemma-2b/qlora.yaml": (25, 0.03847),
    "gemma-7b/lora.yaml": (25, 0.03847), "gemma-7b/qlora.yaml": (25, 0.03847),
    "gemma2-2b/lora.yaml": (25, 0.03847), "gemma2-2b/qlora.yaml": (25, 0.03847),
    "gemma2-9b/lora.yaml": (25, 0.03847), "gemma2-9b/qlora.yaml": (25, 0.03847),
    "llama-2-7b/full.yaml": (25, 0.05), "llama-2-7b/lora.yaml": (100, 0.05),
    "llama-2-7b/qlora.yaml": (100, 0.05),
    "llama-3-8b/full.yaml": (25, 0.05), "llama-3-8b/lora.yaml": (100, 0.05),
    "llama-3-8b/qlora.yaml": (100, 0.05),
    "llama-3.1-8b/full.yaml": (25, 0.05), "llama-3.1-8b/lora.yaml": (100, 0.05),
    "llama-3.1-8b/qlora.yaml": (100, 0.05),
    "llama-3.2-1B/full.yaml": (25, 0.05), "llama-3.2-1B/lora.yaml": (100, 0.05),
    "llama-3.2-1B/qlora.yaml": (100, 0.05),
    "llama-3.2-3B/full.yaml": (25, 0.05), "llama-3.2-3B/lora.yaml": (100, 0.05),
    "llama-3.2-3B/qlora.yaml": (100, 0.05),
    "mistral-7b-v0.2/lora.yaml": (100, 0.05), "mistral-7b-v0.2/qlora.yaml": (100, 0.05),
    "mistral-7b/lora.yaml": (100, 0.05), "mistral-7b/qlora.yaml": (100, 0.05),
    "phi-2/full.yaml": (25, 0.05), "phi-2/lora.yaml": (100, 0.03847), "phi-2/qlora.yaml": (100, 0.03847),
    "phi-3/full.yaml": (25, 0.05), "phi-3/lora.yaml": (100, 0.03847), "phi-3/qlora.yaml": (100, 0.03847),
    "stablelm-base-alpha-3b/full.yaml": (25, 0.03847), "stablelm-base-alpha-3b/lora.yaml": (100, 0.05),
    "stablelm-base-alpha-3b/qlora.yaml": (100, 0.05),
    "tiny-llama/full.yaml": (25, 0.03847), "tiny-llama/lora.yaml": (100, 0.03847),
    "tiny-llama/qlora.yaml": (100, 0.03847),
}
# lit-gpt of the 2023 resource tables (finetune/lora.py at the tables' commit): ``train`` (timed) opens with
# ``validate`` as a sanity check: eval_iters = 100 forward micro-batches and an example of
# eval_max_new_tokens = 100 tokens; 1,000 iterations are 7 optimizer steps, short of eval_interval (100).
LITGPT_2023_EVAL_ITERS = 100
LITGPT_2023_NEW_TOKENS = 100


# Rows that some constant of the time model was read off (throughput.py says which); every other row is
# held out: no constant looked at it. None is left.
USED_FOR_CONSTANTS: set[str] = set()  # every constant now comes from a count, a citation or a derivation


def csv_path() -> Path:
    return LOCAL if LOCAL.exists() else SHARED


def load(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def tokenizer_factor(vocab: int, model_type: str) -> float:
    if vocab >= 100_000:
        return 0.85
    if model_type == "falcon":
        return 1079 / 1304
    if model_type == "gpt_neox":
        return 1034 / 1304
    if model_type == "phi":
        return 1044 / 1304
    return 1.0


def padded_length(batch: int, factor: float, cap: int | None, scale: float = 1.0) -> tuple[float, float]:
    """(E[longest of ``batch`` Alpaca samples] capped at ``cap``, E[one sample] capped): log-normal lengths
    (``scale``: the data set's mean length relative to Alpaca's, same spread)."""
    mean = ALPACA_MEAN_LLAMA2 * factor * scale
    median = mean / math.exp(ALPACA_SIGMA**2 / 2)
    nd = NormalDist()
    n = 4000
    e_max = e_one = 0.0
    for i in range(n):
        u = (i + 0.5) / n
        x = median * math.exp(ALPACA_SIGMA * nd.inv_cdf(u))
        if cap:
            x = min(x, cap)
        e_max += x * batch * u ** (batch - 1) / n
        e_one += x / n
    return e_max, e_one


def gpu_for(row: dict[str, str], mapped: MappedRow) -> tuple[str | None, list[str]]:
    if mapped.gpu:
        return mapped.gpu, []
    t = row["gpu"]
    if "A100" in t:
        return "a100-80gb-sxm4", ["A100 variant not stated: predicted on the 80GB SXM4 (same tensor peak)"]
    return None, []


def work(row: dict[str, str], m: MappedRow, vocab: int, model_type: str) -> dict[str, Any] | str:
    """Micro-batch shapes and the measured seconds of the row's work, or why it cannot be scored."""
    b = int(m.setup.get("batch", 1))
    n_gpus = int(m.setup.get("gpus", 1))
    fac = tokenizer_factor(vocab, model_type)
    scope = row["time_scope"].lower()
    unit = row["throughput_unit"].lower()
    notes: list[str] = []
    if row["time_seconds_derived"] and "per 1k iterations" in scope:
        longest = int(m.setup["seq"])
        e_max, _ = padded_length(b, fac, longest)
        shapes = [(999, e_max), (1, float(longest))]
        notes.append(f"Alpaca batches padded to their longest: E = {e_max:.0f} tokens; first micro-batch "
                     f"{longest}")
        notes.append(f"lit-gpt train(): a sanity validation of {LITGPT_2023_EVAL_ITERS} forward "
                     f"micro-batches and {LITGPT_2023_NEW_TOKENS} generated tokens")
        return {"shapes": shapes, "measured_s": float(row["time_seconds_derived"]), "notes": notes,
                "eval": {"forward": LITGPT_2023_EVAL_ITERS, "tokens": LITGPT_2023_NEW_TOKENS,
                         "length": e_max}}
    if row["time_seconds_derived"] and "alpaca2k" in scope:
        epochs = int(scope.split("for ")[1].split(" epoch")[0])
        cap = int(m.setup["seq"])
        e_max, _ = padded_length(b, fac, cap, ALPACA2K_LENGTH_RATIO)
        config = re.search(r"row (\S+\.yaml)", row["source_location"])
        interval, split = LITGPT_EVAL.get(config.group(1) if config else "", (0, 0.05))
        n_val = math.ceil(ALPACA2K_SAMPLES * split)  # datasets' train_test_split rounds the test size up
        ga = int(m.setup.get("grad_accum", 1))
        iters = epochs * math.ceil((ALPACA2K_SAMPLES - n_val) / (b * n_gpus))
        capped = re.search(r"max_steps=(\d+)", row["notes"])
        if capped:
            iters = min(iters, int(capped.group(1)) * ga)
            notes.append(f"run capped by max_steps={capped.group(1)} (x grad_accum {ga})")
        notes.append(f"Alpaca2k: {iters} micro-batches per GPU of E = {e_max:.0f} padded tokens")
        out = {"shapes": [(iters, e_max)], "measured_s": float(row["time_seconds_derived"]), "notes": notes}
        if interval:
            evals = iters // ga // interval
            val_iters = min(math.ceil(math.ceil(n_val / n_gpus) / b), LITGPT_EVAL_MAX_ITERS)
            out["eval"] = {"forward": LITGPT_SANITY_ITERS + evals * val_iters,
                           "tokens": evals * LITGPT_EVAL_NEW_TOKENS, "length": e_max}
            notes.append(f"litgpt fit: {evals} evaluations of {val_iters} forward micro-batches and "
                         f"{LITGPT_EVAL_NEW_TOKENS} generated tokens, + {LITGPT_SANITY_ITERS} sanity "
                         "micro-batches")
        return out
    if row["time_seconds_derived"] and "512 samples" in scope:
        seq = int(m.setup["seq"])
        return {"shapes": [(512 // b, float(seq))], "measured_s": float(row["time_seconds_derived"]),
                "notes": notes}
    if row["time_seconds_derived"]:
        return f"time scope not mapped: {row['time_scope']}"
    if not row["throughput_value"]:
        return "no throughput or time"
    value = float(row["throughput_value"].replace(",", ""))
    seq = int(m.setup["seq"])
    if "samples/s" in unit:
        return {"shapes": [(1, float(seq))], "measured_s": b / value, "notes": notes}
    if "it/s" in unit:
        return {"shapes": [(1, float(seq))], "measured_s": 1.0 / value, "notes": notes}
    if "token" in unit or "tgs" in unit:
        packed = "pack" in row["other_opts"].lower() or "pack" in row["seq_len_note"].lower()
        unpacked_alpaca = "unpacked" in row["seq_len_note"].lower()
        if unpacked_alpaca:
            e_max, e_one = padded_length(b, fac, seq)
            notes.append(f"unpacked Alpaca: computed E = {e_max:.0f} padded tokens per sample, "
                         f"{e_one:.0f} real")
            return {"shapes": [(1, e_max)], "measured_s": b * e_one / value, "notes": notes}
        if not packed:
            notes.append(f"sample lengths not published: sequences assumed to fill {seq} tokens")
        stated = "not stated" not in unit and any(k in unit for k in ("per gpu", "per device", "total",
                                                                       "tgs"))
        if n_gpus > 1 and not stated:
            # The metric is not stated: scored against the band between its two readings (per GPU: the
            # shorter time; the total of n GPUs: n times it), the calibration data's scoring rule for rows
            # whose metric is not stated. A reading faster than the card's peak is dropped in predict().
            notes.append(f"tokens/s per GPU or total of {n_gpus} GPUs (not stated): scored against both "
                         "readings")
            return {"shapes": [(1, float(seq))], "measured_s": n_gpus * b * seq / value,
                    "band_s": (b * seq / value, n_gpus * b * seq / value), "notes": notes}
        if "tgs" not in unit:
            notes.append("tokens/s read as per GPU")
        return {"shapes": [(1, float(seq))], "measured_s": b * seq / value, "notes": notes}
    return f"throughput unit not mapped: {row['throughput_unit']}"


def band_error(predicted_s: float, lo: float, hi: float) -> float:
    """Predicted tokens/s / measured tokens/s - 1 (= measured seconds / predicted seconds - 1, same work)
    against measured seconds in [lo, hi]: 0 inside, else against the nearer end (the calibration data's
    scoring rule)."""
    if predicted_s < lo:
        return lo / predicted_s - 1.0
    if predicted_s > hi:
        return hi / predicted_s - 1.0
    return 0.0


def predict(row: dict[str, str], m: MappedRow, a10g_tflops: float) -> dict[str, Any] | str:
    try:
        spec = resolve_model(m.model, allow_network=False)
    except TuneplanError as exc:
        return f"model not resolved: {exc}"
    gpu, gnotes = gpu_for(row, m)
    if gpu is None:
        return "GPU not stated"
    acc = resolve_accelerator(gpu)
    w = work(row, m, spec.vocab, spec.model_type)
    if isinstance(w, str):
        return w
    fields = dict(m.setup)
    if isinstance(fields.get("targets"), str) and fields["targets"].startswith("sem:"):
        fields["targets"] = resolve_semantic_targets(spec, fields["targets"])
    compiled = "compile" in row["other_opts"].lower()
    peak = None
    notes = list(gnotes) + list(w["notes"]) + list(m.approximations)
    if acc.id == "a10g" and not acc.bf16_tflops_dense:
        peak = a10g_tflops
        notes.append(f"A10G tensor peak not in the catalog: {a10g_tflops:g} TFLOPS assumed (third-party "
                     "tables)")
    opts = RuntimeOptions(compiled=compiled, peak_tflops=peak)
    seconds = floor = 0.0
    bound = ""
    try:
        for count, length in w["shapes"]:
            run = resolve_run(spec, build_setup(spec, **{**fields, "seq": max(1, round(length))}))
            st = run_step_time(run, acc, opts)
            seconds += count * st.step_seconds / run.setup.grad_accum
            # the forward and backward matmul FLOPs at the card's dense peak: no framework is faster
            floor += count * st.mfu * st.step_seconds / run.setup.grad_accum
            bound = bound or st.bound
        if "eval" in w:
            ev = w["eval"]
            eval_setup = build_setup(spec, **{**fields, "seq": max(1, round(ev["length"]))})
            et = run_eval_time(resolve_run(spec, eval_setup), acc, opts)
            seconds += ev["forward"] * et.forward_seconds + ev["tokens"] * et.token_seconds
    except (TuneplanError, UnknownThroughput) as exc:
        return f"cannot predict: {exc}"
    lo, hi = w.get("band_s", (w["measured_s"], w["measured_s"]))
    banded = "band_s" in w
    if banded and lo < floor:  # the per-GPU reading is faster than the card can go: only the total remains
        lo, banded = hi, False
        notes.append(f"the per-GPU reading ({w['band_s'][0]:.2f} s) is below the card's floor "
                     f"({floor:.2f} s): read as the total")
    if hi < floor:
        return {"row_id": m.row_id, "inconsistent": True, "floor_s": floor, "measured_s": hi}
    err = band_error(seconds, lo, hi)
    method = m.setup.get("method", "?")
    tokens = run.setup.batch * run.setup.seq * run.setup.grad_accum  # the last shape's, per GPU per step
    regimes = {"tokens per step": "small (<= 4096 per GPU)" if tokens <= SMALL_STEP_TOKENS else "large",
               "cards": "one card" if run.setup.world_size == 1 else "several cards",
               "offload": "offload" if run.setup.offload != "none" else "no offload"}
    return {**regimes, "row_id": m.row_id, "framework": m.framework, "method": method, "gpu": gpu,
            "floor_s": floor, "framework/method": f"{m.framework}/{method}",
            "held_out": m.row_id not in USED_FOR_CONSTANTS, "model": m.model, "measured_s": hi,
            "band_s": (lo, hi) if banded else None, "predicted_s": seconds,
            "rel_err": err, "bound": bound,
            "assumed_peak": peak is not None or unverified_figures(acc) is not None, "compiled": compiled,
            "notes": notes}


def summarize(res: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    groups: dict[str, list[float]] = defaultdict(list)
    for r in res:
        groups[r[key] if key != "all" else "all"].append(r["rel_err"])
    out = []
    for g, errs in sorted(groups.items()):
        ab = [abs(e) for e in errs]
        out.append({key: g, "n": len(errs), "median_abs": statistics.median(ab), "p90_abs": pct(ab, 0.9),
                    "median_signed": statistics.median(errs)})
    return out


def run(a10g_tflops: float) -> dict[str, Any]:
    path = csv_path()
    results, skipped, inconsistent = [], [], []
    for raw in load(path):
        if not (raw["throughput_value"] or raw["time_value"]):
            continue
        m = map_row(raw)
        if isinstance(m, Unmapped):
            skipped.append({"row_id": m.row_id, "reason": m.reason})
            continue
        p = predict(raw, m, a10g_tflops)
        if isinstance(p, str):
            skipped.append({"row_id": m.row_id, "reason": p})
        elif p.get("inconsistent"):
            inconsistent.append(p)
        else:
            results.append(p)
    catalog_only = [r for r in results if not r["assumed_peak"]]
    held_out = [r for r in catalog_only if r["held_out"]]
    return {"csv": str(path), "results": results, "skipped": skipped, "source_inconsistent": inconsistent,
            "banded": sum(1 for r in results if r["band_s"]),
            "summary": {k: summarize(results, k) for k in ("framework", "method", "framework/method", "gpu",
                                                           *REGIMES, "all")},
            "headline": {"all rows": summarize(results, "all"),
                         "verified card figures (not the A10G's)": summarize(catalog_only, "all"),
                         "verified figures, held out (no constant read off them)":
                             summarize(held_out, "all")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", action="store_true", help="print every scored row")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--a10g-tflops", type=float, default=70.0,
                    help="A10G dense bf16 peak to assume (the catalog leaves it blank) [70]")
    a = ap.parse_args()
    out = run(a.a10g_tflops)
    if a.json:
        print(json.dumps(out, indent=2, default=str))
        return
    print(f"calibration data: {out['csv']}")
    print(f"scored rows: {len(out['results'])}; skipped: {len(out['skipped'])}; "
          f"scored against a band (metric not stated: per GPU or total): {out['banded']}")
    for r in out["source_inconsistent"]:
        print(f"  source-inconsistent (left out): {r['row_id']} published {r['measured_s']:.2f} s of work, "
              f"below the card's floor of {r['floor_s']:.2f} s (its matmul FLOPs at the dense peak)")
    # err = measured seconds / predicted seconds - 1 = predicted tokens/s / measured tokens/s - 1
    print("relative error = predicted tokens/s / measured tokens/s - 1 (positive: we predict too fast)")
    if a.rows:
        for r in out["results"]:
            print(f"  {r['row_id']} {r['framework']:12s} {r['method']:6s} {r['gpu']:16s} "
                  f"{r['model'][:34]:34s} meas {r['measured_s']:9.1f}s pred {r['predicted_s']:9.1f}s "
                  f"err {r['rel_err']:+6.0%} {r['bound']}{' (band)' if r['band_s'] else ''}")
    for key, rows in out["summary"].items():
        print(f"\nby {key}:")
        print(f"  {'group':22s} {'n':>4s} {'median|err|':>12s} {'p90|err|':>9s} {'median err':>11s}")
        for s in rows:
            print(f"  {str(s[key]):22s} {s['n']:4d} {s['median_abs']:12.0%} {s['p90_abs']:9.0%} "
                  f"{s['median_signed']:+11.0%}")
    print("\nheadline:")
    for name, rows in out["headline"].items():
        if rows:
            s = rows[0]
            print(f"  {name:52s} n={s['n']:3d}  median|err| {s['median_abs']:4.0%}  p90 {s['p90_abs']:4.0%}  "
                  f"median signed {s['median_signed']:+.0%}")
    reasons: dict[str, int] = defaultdict(int)
    for sk in out["skipped"]:
        reasons[sk["reason"]] += 1
    print("\nskipped:")
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  {n:3d}  {reason}")


if __name__ == "__main__":
    main()
