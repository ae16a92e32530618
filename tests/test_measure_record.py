"""measure/record.py: a measured run as a calibration row, appended to a CSV without rewriting it."""

from __future__ import annotations

import csv

import pytest

from tuneplan.errors import TuneplanError
from tuneplan.measure.columns import MEASURED_COLUMNS, SOURCE_GROUP
from tuneplan.measure.record import append_record, build_record, check_record_target
from tuneplan.measure.runner import MeasureResult

GIB = 1024**3


def result(**kw) -> MeasureResult:
    setup = {"method": "qlora", "bits": 8, "rank": 16, "alpha": None, "targets": "all-linear",
             "precision": "bf16-mixed", "optimizer": "adamw", "batch": 2, "seq": 256, "grad_accum": 4,
             "framework": "hf"}
    base = dict(model="Qwen/Qwen2.5-0.5B", setup=setup, device="cuda", device_name="NVIDIA H200",
                memory_kind="cuda", memory_metric="torch.cuda.max_memory_allocated", steps=3,
                trainable_params=1234, peak_bytes=3 * GIB + GIB // 2, reserved_peak_bytes=4 * GIB,
                step_seconds=[1.0, 0.5, 0.25, 0.25], tokens_per_s=2048.0, timed_steps="steps 2..3")
    return MeasureResult(**{**base, **kw})


def test_a_gpu_row_by_hand():
    row = build_record(result(), [], 494_032_768, {"allocated": GIB, "reserved": 2 * GIB, "device": 3 * GIB})
    assert tuple(row) == MEASURED_COLUMNS
    assert row["source_group"] == SOURCE_GROUP and row["measurement_status"] == "measured"
    assert row["method"] == "qlora-8bit"
    assert row["lora_alpha"] == "32"  # alpha unset: the setup's documented default, 2 x rank
    assert row["global_batch"] == "8"  # micro-batch 2 x accumulation 4 on one GPU
    assert row["peak_mem_value"] == "3.500" and row["peak_mem_unit"] == "GiB"
    assert row["peak_mem_alt_value"] == "4.000"
    assert row["params_nominal_b"] == "0.494"
    assert row["time_value"] == "0.5000"  # (1.0 + 0.5 + 0.25 + 0.25) / 4
    assert row["throughput_value"] == "2048.0"
    assert (row["n_gpus"], row["parallelism"]) == ("1", "single GPU")
    assert row["model_hf_id"] == "Qwen/Qwen2.5-0.5B"
    assert "est_allocated_gib=1.000" in row["notes"] and "est_device_gib=3.000" in row["notes"]


def test_a_cpu_row_has_no_gpu_columns():
    row = build_record(result(device="cpu", memory_kind="host", memory_metric="host RSS", model="./cfg.json",
                              step_seconds=[], tokens_per_s=None), [], 10**9, {})
    assert (row["n_gpus"], row["peak_mem_alt_value"], row["peak_mem_alt_metric"]) == ("0", "", "")
    assert row["time_value"] == "" and row["throughput_value"] == ""
    assert row["model_hf_id"] == ""  # a local file is no Hub id


def test_full_fine_tune_has_no_lora_columns():
    setup = {**result().setup, "method": "full"}
    row = build_record(result(setup=setup), [], 10**9, {})
    assert row["method"] == "full" and row["lora_rank"] == row["lora_alpha"] == row["lora_targets"] == ""


def test_append_creates_the_header_then_adds_rows(tmp_path):
    path = tmp_path / "sub" / "measured.csv"
    row = build_record(result(), [], 10**9, {})
    append_record(path, row)
    append_record(path, {**row, "row_id": "second"})
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["row_id"] for r in rows] == [row["row_id"], "second"]
    assert rows[0] == row  # a CSV round trip keeps every column


def test_append_after_a_file_without_a_final_newline(tmp_path):
    path = tmp_path / "m.csv"
    row = build_record(result(), [], 10**9, {})
    append_record(path, row)
    path.write_text(path.read_text().rstrip("\n"))
    append_record(path, {**row, "row_id": "next"})
    with path.open(newline="", encoding="utf-8") as f:
        assert [r["row_id"] for r in csv.DictReader(f)] == [row["row_id"], "next"]


def test_a_csv_with_other_columns_is_refused_untouched(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TuneplanError) as err:
        append_record(path, build_record(result(), [], 10**9, {}))
    assert err.value.field == "record"
    assert path.read_text() == "a,b,c\n1,2,3\n"


def test_a_folder_and_a_wrong_row_are_refused(tmp_path):
    with pytest.raises(TuneplanError, match="folder"):
        check_record_target(tmp_path)
    with pytest.raises(TuneplanError):
        append_record(tmp_path / "x.csv", {"row_id": "only one column"})
    assert not (tmp_path / "x.csv").exists()
    assert check_record_target(tmp_path / "new.csv") == tmp_path / "new.csv"
