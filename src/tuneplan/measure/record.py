"""One measured run as a calibration row (the columns of the published calibration table), appended.

Mapping, so the accuracy benchmark reads our rows like the published ones:
- ``peak_mem_value`` is ``torch.cuda.max_memory_allocated`` in GiB on a GPU (``peak_mem_metric`` says
  so), and ``peak_mem_alt_*`` is ``max_memory_reserved``; the NVML device figure, the per-phase peaks and
  the estimate of the same run go into ``notes`` as ``key=value`` pairs (GiB).
- On a CPU run the figure is the host process's RSS and the metric says "host ... not GPU memory";
  ``n_gpus`` is 0 and ``gpu`` names the CPU.
- ``throughput_value`` is tokens per second of this device over the timed steps; ``time_value`` the mean
  seconds per optimizer step.
Appending never rewrites the file: a missing or empty file gets the header first; a file whose header is
different is refused with an error, untouched.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import uuid
from pathlib import Path
from typing import Any

from tuneplan import __version__
from tuneplan.errors import TuneplanError
from tuneplan.estimator.types import GIB
from tuneplan.measure.columns import MEASURED_COLUMNS, SOURCE_GROUP
from tuneplan.measure.runner import MeasureResult
from tuneplan.safe_read import user_path

METHOD_NAMES = {"full": "full", "freeze": "freeze", "lora": "lora"}  # qlora -> qlora-4bit / qlora-8bit
PRECISION_TEXT = {
    "bf16-mixed": "bf16-mixed (autocast bf16; trainable params fp32)",
    "fp16-mixed": "fp16-mixed (autocast fp16 + GradScaler; trainable params fp32)",
    "bf16": "bf16 (pure bf16 params, no autocast)",
    "fp16": "fp16 (pure fp16 params, no autocast)",
    "fp32": "fp32",
}


def _g(n: int | None) -> str:
    return "" if n is None else f"{n / GIB:.3f}"


def build_record(result: MeasureResult, comparison: list[dict[str, Any]], params_total: int,
                 estimate_summary: dict[str, int]) -> dict[str, str]:
    s = result.setup
    on_gpu = result.memory_kind == "cuda"
    method = METHOD_NAMES.get(s["method"], f"qlora-{s.get('bits') or 4}bit")
    now = _dt.datetime.now(_dt.timezone.utc)
    mean_step = sum(result.step_seconds) / len(result.step_seconds) if result.step_seconds else None
    notes = [f"est_allocated_gib={_g(estimate_summary.get('allocated'))}",
             f"est_reserved_gib={_g(estimate_summary.get('reserved'))}",
             f"est_device_gib={_g(estimate_summary.get('device'))}"]
    for k, v in result.phase_peaks.items():
        notes.append(f"meas_{k}_peak_gib={_g(v)}")
    if result.persistent_bytes is not None:
        notes.append(f"meas_before_step1_gib={_g(result.persistent_bytes)}")
    if result.nvml_device_peak_bytes is not None:
        notes.append(f"nvml_device_used_peak_above_baseline_gib={_g(result.nvml_device_peak_bytes)}")
    if result.nvml_process_peak_bytes is not None:
        notes.append(f"nvml_process_used_peak_gib={_g(result.nvml_process_peak_bytes)}")
    notes.append("versions " + " ".join(f"{k}={v}" for k, v in result.versions.items()))
    if result.error:
        notes.append(f"error: {result.error}")
    notes.extend(result.notes)
    hf_id = result.model if result.model.count("/") == 1 and not result.model.endswith(".json") else ""
    row = {
        "row_id": f"TP-{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}",
        "source_group": SOURCE_GROUP,
        "source_ref": f"tuneplan {__version__} measure",
        "source_location": "this machine",
        "source_date": now.date().isoformat(),
        "framework": "HF transformers + PEFT (tuneplan measure runner, "
                     f"{s['framework']} profile)",
        "framework_family": "hf-transformers+peft" if s["method"] in ("lora", "qlora") else "hf-transformers",
        "model_as_published": result.model,
        "model_hf_id": hf_id,
        "params_nominal_b": f"{params_total / 1e9:.3f}",
        "task": "synthetic: random token ids, labels = inputs",
        "method": method,
        "method_detail": "; ".join(v for k, v in result.details.items()
                                   if k in ("lora", "freeze", "quantization"))
                         or ("full fine-tune" if s["method"] == "full" else s["method"]),
        "lora_rank": str(s["rank"]) if s["method"] in ("lora", "qlora") else "",
        "lora_alpha": str(s.get("alpha") or 2 * s["rank"]) if s["method"] in ("lora", "qlora") else "",
        "lora_targets": (s.get("targets") or "") if s["method"] in ("lora", "qlora") else "",
        "trainable_params": str(result.trainable_params),
        "precision": PRECISION_TEXT.get(s["precision"], s["precision"]),
        "quantization": result.details.get("quantization", ""),
        "optimizer": result.details.get("optimizer", s.get("optimizer") or ""),
        "micro_batch_size": str(s["batch"]),
        "seq_len": str(s["seq"]),
        "seq_len_note": "fixed length (random ids, no padding)",
        "grad_accum": str(s["grad_accum"]),
        "global_batch": str(s["batch"] * s["grad_accum"]),
        "grad_checkpointing": result.details.get("gradient_checkpointing", ""),
        "attention_impl": result.details.get("attn_implementation", ""),
        "other_opts": f"{result.steps} optimizer steps; {result.details.get('weights', '')}; "
                      f"load dtype {result.details.get('load_dtype', '')}; "
                      f"autocast {result.details.get('autocast', '')}",
        "parallelism": "single GPU" if on_gpu else "single device (CPU)",
        "n_gpus": "1" if on_gpu else "0",
        "offload": "none",
        "gpu": result.device_name,
        "outcome": result.outcome,
        "mem_budget_gb": "",
        "peak_mem_value": _g(result.peak_bytes),
        "peak_mem_unit": "GiB" if result.peak_bytes is not None else "",
        "peak_mem_gib_derived": _g(result.peak_bytes),
        "peak_mem_metric": result.memory_metric,
        "peak_mem_alt_value": _g(result.reserved_peak_bytes) if on_gpu else "",
        "peak_mem_alt_unit": "GiB" if on_gpu and result.reserved_peak_bytes is not None else "",
        "peak_mem_alt_metric": "torch.cuda.max_memory_reserved" if on_gpu else "",
        "throughput_value": f"{result.tokens_per_s:.1f}" if result.tokens_per_s else "",
        "throughput_unit": f"tokens/sec on this device ({result.timed_steps})" if result.tokens_per_s else "",
        "time_value": f"{mean_step:.4f}" if mean_step is not None else "",
        "time_unit": "s" if mean_step is not None else "",
        "time_scope": "mean per optimizer step over all steps" if mean_step is not None else "",
        "time_seconds_derived": f"{mean_step:.4f}" if mean_step is not None else "",
        "measurement_status": "measured",
        "config_confidence": "high",
        "notes": "; ".join(notes),
    }
    return {k: row[k] for k in MEASURED_COLUMNS}


def check_record_target(path: str | Path) -> Path:
    """Refuse, before any run, a path that is a folder or a CSV with other columns."""
    p = user_path(str(path), "record")
    if p.is_dir():
        raise TuneplanError(f"{p} is a folder", field="record", accepted="a .csv file path")
    if p.exists() and p.stat().st_size > 0:
        with p.open(newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
        if tuple(header) != MEASURED_COLUMNS:
            raise TuneplanError(
                f"{p} exists with other columns ({len(header)} columns, first {header[:3]}); "
                "refusing to append to it", field="record",
                accepted="a new file, or a file in the format of measured.csv")
    return p


def append_record(path: str | Path, row: dict[str, str]) -> Path:
    """Append ``row`` to the CSV at ``path``; create it with the header when missing or empty."""
    if set(row) != set(MEASURED_COLUMNS):
        raise TuneplanError("record does not have the calibration columns", field="record")
    p = check_record_target(path)
    fresh = not p.exists() or p.stat().st_size == 0
    if not fresh:
        with p.open("rb") as f:
            f.seek(-1, 2)
            needs_newline = f.read(1) not in (b"\n", b"\r")
    else:
        p.parent.mkdir(parents=True, exist_ok=True)
        needs_newline = False
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(MEASURED_COLUMNS), lineterminator="\n")
    if fresh:
        w.writeheader()
    w.writerow(row)
    from tuneplan.safe_write import append_text

    # old + new written to a new file and renamed over the old one: a full disk leaves the old file whole
    return append_text(p, ("\n" if needs_newline else "") + buf.getvalue(), field="record", force_link=True)
