"""The accuracy benchmark's reading of the calibration rows: every row is accounted for, and the
row-level facts it uses (a source's era, a stated earlier reservation) come from the row itself."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from accuracy import run  # noqa: E402
from calibration_rows import load_rows, map_row  # noqa: E402


def test_no_row_is_dropped_silently() -> None:
    res = run("analytic")
    ids = [r["row_id"] for part in ("rows", "oom_rows", "below_floor", "unmapped") for r in res[part]]
    assert sorted(ids) == sorted(r["row_id"] for r in load_rows())
    assert all(u["reason"] for u in res["unmapped"])


def test_a_stated_post_init_reservation_floors_the_reserved_reading() -> None:
    # torchtune's QLoRA tutorial (M0170) logs 9.13 GB reserved after model init and 9.29 GB in training:
    # the caching allocator kept the load's segments, so the training reading is at least the first
    rows = {r["row_id"]: r for r in load_rows()}
    m = map_row(rows["M0170"])
    assert m.metric == "reserved" and m.reserved_floor_bytes == int(9.13e9)
    scored = {r["row_id"]: r for r in run("analytic")["rows"]}
    assert scored["M0170"]["predicted_bytes"] >= int(9.13e9)
    # rows without such a statement are untouched
    assert [k for k, r in rows.items() if getattr(map_row(r), "reserved_floor_bytes", None)] == ["M0170"]


def test_calibration_rows_before_torch_2_keep_gradients() -> None:
    from calibration_rows import TORCH_2_0

    rows = {r["row_id"]: r for r in load_rows()}
    bert = map_row(rows["M0249"])  # transformers docs, 2022: torch 1.x
    assert rows["M0249"]["source_date"][:10] < TORCH_2_0 and bert.setup.get("keep_grads") is True
    later = [map_row(r) for r in rows.values() if r["source_group"] == "hf-peft"]
    assert later and not any(getattr(m, "setup", {}).get("keep_grads") for m in later)


def test_peft_accelerate_docs_rows_carry_their_launch_commands_dropout() -> None:
    # PEFT's docs/source/accelerate/{deepspeed,fsdp}.md launch commands pass --lora_dropout 0.1; the CSV has
    # no dropout column, so the mapping adds it for those LoRA/QLoRA rows and only for them
    rows = {r["row_id"]: r for r in load_rows()}
    with_dropout = sorted(k for k, r in rows.items()
                          if getattr(map_row(r), "setup", {}).get("dropout") is not None)
    assert with_dropout == ["M0181", "M0182", "M0183", "M0184", "M0185"]
    assert all(map_row(rows[k]).setup["dropout"] == 0.1 for k in with_dropout)
