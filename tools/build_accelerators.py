"""Build src/tuneplan/catalog/accelerators.json from the reference GPU table, gpus.csv (by default the one
in the reference folder beside the repository).

Facts are carried over as published; blanks stay null (unknown), `verified`, `source` and
`unverified_or_derived_fields` travel with every row. Two things are derived here, and each says how:
the date of the cloud price reading, and how many devices software sees per package. Run from the
repo root:
    python tools/build_accelerators.py [path/to/gpus.csv]
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

SRC = (Path(sys.argv[1]) if len(sys.argv) > 1
       else Path(__file__).resolve().parents[2] / "shared/reference/gpus.csv")
OUT = Path(__file__).resolve().parents[1] / "src/tuneplan/catalog/accelerators.json"
# Cards the reference table lacks, same columns, kept in the repository (each row carries its source).
ADDED = Path(__file__).resolve().parent / "accelerators_added.csv"

# Price readings named in compat.md section 8 by tag: P1 "read off the provider's own page on
# 2026-09-09", P2 "RunPod catalogue snapshot, 2026-09-07". P3 listings are undated.
PRICE_TAG_DATES = {"P1": "2026-09-09", "P2": "2026-09-07"}

# Devices that software sees per package. MI250X: "each GCD appears to software as a separate 64GB
# device (figures are per package)" (gpus.csv notes; compat.md section 6). Every other row is per device
# (A16's row is already per GPU).
DEVICES_PER_PACKAGE = {"mi250x": 2}


def num(v: str) -> float | None:
    v = (v or "").strip()
    if not v:
        return None
    m = re.match(r"^-?\d+(\.\d+)?", v.replace(",", ""))
    return float(m.group(0)) if m else None


def slug(name: str) -> str:
    s = name.lower()
    s = re.sub(r"\(.*?\)", "", s)
    s = s.replace("geforce", "").replace("tesla", "").replace("nvidia", "").replace("instinct", "")
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-")


def cc(v: str) -> list[int] | None:
    m = re.match(r"^\s*(\d+)\.(\d+)\s*$", v or "")
    return [int(m.group(1)), int(m.group(2))] if m else None


def cloud_price_date(price_text: str, basis: str) -> str | None:
    """Date of the lowest cloud price reading (the figure in ``cloud_usd_per_gpu_hr_low``).

    The basis text lists several readings; the date that belongs to the low figure is the first ISO
    date or P1/P2 tag after that figure, skipping launch dates ("launch MSRP 2022-10-12"). No date
    anywhere -> "undated" (the T4 and MI300X rows say so themselves).
    """
    price_text = (price_text or "").strip()
    if not price_text:
        return None
    start = basis.find(price_text)
    tail = basis[start:] if start >= 0 else basis
    pattern = re.compile(r"\b(20\d\d-\d\d-\d\d)\b|\b(P1|P2)\)")
    for m in pattern.finditer(tail):
        if m.group(1):
            before = tail[max(0, m.start() - 12):m.start()].lower()
            if "msrp" in before or "launch" in before:
                continue
            return m.group(1)
        return PRICE_TAG_DATES[m.group(2)]
    return "undated"


def row_to_entry(r: dict[str, str]) -> dict[str, object]:
    acc_id = slug(r["name"])
    return {
        "id": acc_id,
        "vendor": r["vendor"],
        "name": r["name"],
        "form_factor": r["form_factor"] or None,
        "architecture": r["architecture"] or None,
        "memory_gb_marketed": num(r["memory_gb_marketed"]),
        "memory_gib_usable_observed": num(r["memory_gib_usable_observed"]),
        "memory_type": r["memory_type"] or None,
        "memory_bandwidth_gbs": num(r["memory_bandwidth_gbs"]),
        "fp32_tflops": num(r["fp32_tflops_nontensor"]),
        "bf16_tflops_dense": num(r["bf16_fp16_tensor_dense_tflops"]),
        "fp16_fp16acc_tflops_dense": num(r["fp16_tensor_fp16acc_dense_tflops"]),
        "fp8_tflops_dense": num(r["fp8_dense_tflops"]),
        "int8_tops_dense": num(r["int8_dense_tops"]),
        "compute_capability": cc(r["compute_capability"]),
        "compute_target": r["compute_capability"] or None,
        "tensor_cores": r["tensor_cores"] or None,
        "bf16_support": r["bf16_support"] or None,
        "fp8_support": r["fp8_support"] or None,
        "interconnect": r["interconnect"] or None,
        "tdp_w": num(r["tdp_w"]),
        "release_year": int(num(r["release_year"])) if num(r["release_year"]) else None,
        "launch_price_usd": num(r["launch_price_usd"]),
        "cloud_usd_per_gpu_hr": num(r["cloud_usd_per_gpu_hr_low"]),
        "cloud_price_date": cloud_price_date(r["cloud_usd_per_gpu_hr_low"], r["price_basis_and_date"] or ""),
        "price_basis_and_date": r["price_basis_and_date"] or None,
        "devices_per_package": DEVICES_PER_PACKAGE.get(acc_id, 1),
        "source": r["source"],
        "verified": r["verified"],
        "unverified_or_derived_fields": r["unverified_or_derived_fields"] or None,
        "notes": r["notes"] or None,
    }


def added_rows(path: Path = ADDED) -> list[dict[str, str]]:
    """Rows of ``accelerators_added.csv``; a name the reference table also has is an error (no silent
    override)."""
    if not path.is_file():
        return []
    return list(csv.DictReader(path.open(encoding="utf-8")))


def build(src: Path) -> list[dict[str, object]]:
    rows = list(csv.DictReader(src.open(encoding="utf-8"))) + added_rows()
    out = [row_to_entry(r) for r in rows]
    ids = [e["id"] for e in out]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise SystemExit(f"duplicate accelerator ids from {src}: {dupes}")
    return fill_time_figures(out)


FIGURES = Path(__file__).resolve().parent / "accelerator_figures.csv"
# Fields the time and cost model needs that the reference leaves blank for some cards.
FIGURE_FIELDS = ("bf16_tflops_dense", "memory_bandwidth_gbs", "tdp_w", "cloud_usd_per_gpu_hr",
                 "launch_price_usd")


def fill_time_figures(entries: list[dict[str, object]], path: Path = FIGURES) -> list[dict[str, object]]:
    """Fill blanks of the reference with the figures of ``accelerator_figures.csv`` (id, field, value, source,
    verified). A figure never replaces a published value; every filled figure is named, with its source, in
    the entry's ``unverified_or_derived_fields`` (verified=no) or ``notes`` (verified=yes), and a filled price
    also in ``price_basis_and_date``, so an estimate can say which of its inputs are not verified."""
    by_id = {e["id"]: e for e in entries}
    for r in csv.DictReader(path.open(encoding="utf-8")):
        e, key = by_id.get(r["id"]), r["field"]
        if e is None or key not in FIGURE_FIELDS:
            raise SystemExit(f"{path.name}: unknown accelerator id or field: {r['id']} {key}")
        if e[key] is not None:
            raise SystemExit(f"{path.name}: {r['id']} {key} is published ({e[key]}); "
                             "remove the filled figure")
        e[key] = num(r["value"])
        text = f"{key} {r['value']} filled in: {r['source']}"
        slot = "unverified_or_derived_fields" if r["verified"] != "yes" else "notes"
        e[slot] = f"{e[slot]}; {text}" if e[slot] else text
        if key == "cloud_usd_per_gpu_hr":
            e["price_basis_and_date"] = f"{r['value']}/hr -- {r['source']}"
            e["cloud_price_date"] = "undated"
    return entries


def main() -> None:
    out = build(SRC)
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(out)} accelerators to {OUT}")


if __name__ == "__main__":
    main()
