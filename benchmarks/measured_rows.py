"""tuneplan's own GPU measurements (``benchmarks/data/measured_tuneplan.csv``, from gpu_sweep.sh) against the
estimate recorded beside each row.

    python benchmarks/measured_rows.py [CSV]

For each row: the allocated peak (``torch.cuda.max_memory_allocated``), the analytic estimate that
``tuneplan measure`` recorded for the same setup (``est_allocated_gib`` in notes), and their difference.
Rows measured while the runner still kept the model output through backward carry
``runner_held_logits_gib`` (2 B x vocab x tokens of 16-bit logits that transformers' Trainer frees before
backward: ``compute_loss`` returns the loss alone). For those the script also prints the Trainer's figure
derived from the phase peaks: max(forward, backward - held logits, optimizer step). Derived, not measured;
a run with today's runner measures it directly.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent / "data" / "measured_tuneplan.csv"


def notes(row: dict[str, str]) -> dict[str, float]:
    """The numeric key=value pairs of a row's notes."""
    out: dict[str, float] = {}
    for part in row["notes"].split("; "):
        key, _, value = part.partition("=")
        try:
            out[key.strip()] = float(value.split()[0])
        except (ValueError, IndexError):
            continue
    return out


def trainer_peak(n: dict[str, float]) -> float:
    """The peak without the logits the runner held through backward (GiB)."""
    held = n.get("runner_held_logits_gib", 0.0)
    return max(n["meas_forward_peak_gib"], n["meas_backward_peak_gib"] - held,
               n["meas_optimizer_step_peak_gib"])


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT
    raw, derived, today = [], [], []
    print(f"{'model':28} {'method':6} {'batch x seq':>11} {'measured':>9} {'estimate':>9} {'diff':>7} "
          f"{'Trainer*':>9} {'diff*':>7}")
    for row in csv.DictReader(path.open(encoding="utf-8")):
        n = notes(row)
        est, meas = n["est_allocated_gib"], float(row["peak_mem_value"])
        shape = f"{row['micro_batch_size']}x{row['seq_len']}"
        if row["outcome"] != "measured":
            print(f"{row['model_hf_id'][:28]:28} {row['method'][:6]:6} {shape:>11} {row['outcome']:>9} "
                  f"{est:9.2f}  ({meas:.2f} GiB reached before the failed allocation)")
            continue
        fixed = trainer_peak(n)
        raw.append(est / meas - 1)
        derived.append(est / fixed - 1)
        if "runner_held_logits_gib" not in n:
            today.append(raw[-1])
        print(f"{row['model_hf_id'][:28]:28} {row['method'][:6]:6} {shape:>11} {meas:9.2f} {est:9.2f} "
              f"{100 * raw[-1]:+6.1f}% {fixed:9.2f} {100 * derived[-1]:+6.1f}%")
    for name, xs in (("measured", raw), ("Trainer* (derived)", derived),
                     ("measured, rows without held logits (today's runner; BERT)", today)):
        if not xs:
            continue
        a = sorted(abs(x) for x in xs)
        print(f"{name}: {len(xs)} rows, median |diff| {100 * statistics.median(a):.1f} %, "
              f"max {100 * a[-1]:.1f} %, signed median {100 * statistics.median(xs):+.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
