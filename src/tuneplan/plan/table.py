"""The size x method table (7B-70B x full, LoRA, QLoRA-8, QLoRA-4), computed by the estimator.

The rule-of-thumb ranges that hardware guides print are kept beside each figure as a labelled reference,
so a reader can see where the folk numbers and the computed ones part ways.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneplan.api import estimate
from tuneplan.catalog.models import resolve_model

SIZES = (
    ("7B", "meta-llama/Llama-2-7b-hf"),
    ("13B", "meta-llama/Llama-2-13b-hf"),
    ("30B/32B", "Qwen/Qwen2.5-32B"),
    ("70B", "meta-llama/Llama-2-70b-hf"),
)
METHODS = (
    ("full 16-bit", {"method": "full"}),
    ("LoRA 16-bit", {"method": "lora"}),
    ("QLoRA 8-bit", {"method": "qlora", "bits": 8}),
    ("QLoRA 4-bit", {"method": "qlora", "bits": 4}),
)
# A fine-tuning hardware guide's table, GB, "common experience values"; reference only.
RULE_OF_THUMB_GB = {
    "7B": ("60-80", "15-20", "9-10", "6-8"),
    "13B": ("120-130", "28-32", "17-18", "9-12"),
    "30B/32B": ("280-290", "60-65", "38-40", "20-24"),
    "70B": ("660-680", "140-150", "88-90", "46-50"),
}


@dataclass(frozen=True)
class TableCell:
    size: str
    model: str
    method: str
    device_peak_bytes: int
    allocated_peak_bytes: int
    rule_of_thumb_gb: str


def size_method_table(**setup: Any) -> list[TableCell]:
    cells = []
    for size, model_id in SIZES:
        spec = resolve_model(model_id)
        for j, (label, kw) in enumerate(METHODS):
            est = estimate(spec, **{**setup, **kw})
            cells.append(TableCell(size, model_id, label, est.breakdown.device_peak_bytes,
                                   est.breakdown.allocated_peak_bytes, RULE_OF_THUMB_GB[size][j]))
    return cells
