"""Build src/tuneplan/catalog/accelerators.json from ../shared/reference/gpus.csv.

Facts are carried over as published; blanks stay null (unknown). Run from the repo root:
    python tools/build_accelerators.py [path/to/gpus.csv]
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

SRC = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared/reference/gpus.csv"
OUT = Path(__file__).resolve().parents[1] / "src/tuneplan/catalog/accelerators.json"


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


def main() -> None:
    rows = list(csv.DictReader(SRC.open()))
    out = []
    for r in rows:
        out.append({
            "id": slug(r["name"]),
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
            "price_basis_and_date": r["price_basis_and_date"] or None,
            "source": r["source"],
            "verified": r["verified"],
            "unverified_or_derived_fields": r["unverified_or_derived_fields"] or None,
            "notes": r["notes"] or None,
        })
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(out)} accelerators to {OUT}")


if __name__ == "__main__":
    main()
