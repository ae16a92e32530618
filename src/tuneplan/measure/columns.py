"""The column format of calibration records, copied from the published calibration table (measured.csv).

``tuneplan measure --record FILE`` appends rows in exactly this format so a measured run on this machine
sits next to the published runs and ``benchmarks/accuracy.py`` reads both the same way. The list is data
held here (the package never reads the calibration folder at run time); a test checks it against that header
when the folder is present. Meaning of each column: the calibration notes.
"""

from __future__ import annotations

MEASURED_COLUMNS: tuple[str, ...] = (
    "row_id", "source_group", "source_ref", "source_location", "source_date", "framework",
    "framework_family", "model_as_published", "model_hf_id", "params_nominal_b", "task", "method",
    "method_detail", "lora_rank", "lora_alpha", "lora_targets", "trainable_params", "precision",
    "quantization", "optimizer", "micro_batch_size", "seq_len", "seq_len_note", "grad_accum",
    "global_batch", "grad_checkpointing", "attention_impl", "other_opts", "parallelism", "n_gpus",
    "offload", "gpu", "outcome", "mem_budget_gb", "peak_mem_value", "peak_mem_unit",
    "peak_mem_gib_derived", "peak_mem_metric", "peak_mem_alt_value", "peak_mem_alt_unit",
    "peak_mem_alt_metric", "throughput_value", "throughput_unit", "time_value", "time_unit",
    "time_scope", "time_seconds_derived", "measurement_status", "config_confidence", "notes",
)

SOURCE_GROUP = "tuneplan-measure"  # rows this tool wrote, told apart from published ones
