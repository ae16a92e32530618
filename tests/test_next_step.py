"""A setup that does not fit gets its next step: the largest component, one change whose estimate fits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tuneplan.api import estimate
from tuneplan.plan.next_step import next_step


def test_7b_qlora_on_an_8gb_4060_points_at_a_framework_that_fits() -> None:
    est = estimate("Qwen/Qwen2.5-7B-Instruct", gpu="rtx-4060", method="qlora", rank=16, timing=False)
    assert est.fits is False
    step = next_step(est)
    assert step is not None and step["short_by_bytes"] > 0
    comps = est.breakdown.components
    assert step["largest_component"] == max(comps, key=lambda k: comps[k])
    ch = step["change"]
    assert ch is not None and ch["field"] == "framework" and ch["from"] == "hf"
    # independent: the same setup with that framework fits the card
    again = estimate("Qwen/Qwen2.5-7B-Instruct", gpu="rtx-4060", method="qlora", rank=16,
                     framework=ch["to"], timing=False)
    assert again.fits and again.breakdown.device_peak_bytes == ch["device_peak_bytes"]


def test_a_pinned_framework_is_not_changed_and_a_shorter_sequence_is_a_boundary() -> None:
    est = estimate("Qwen/Qwen2.5-0.5B", gpu="rtx-4060", method="lora", framework="hf", seq=32768,
                   timing=False)
    step = next_step(est)
    assert step is not None
    ch = step["change"]
    assert ch is not None and ch["field"] == "seq"
    assert step["largest_component"] == "logits_loss"  # 32k tokens x 151,936 vocabulary
    assert estimate("Qwen/Qwen2.5-0.5B", gpu="rtx-4060", method="lora", framework="hf", seq=ch["to"],
                    timing=False).fits
    assert not estimate("Qwen/Qwen2.5-0.5B", gpu="rtx-4060", method="lora", framework="hf",
                        seq=ch["to"] + 1, timing=False).fits
    fits = estimate("Qwen/Qwen2.5-0.5B", gpu="a100-80gb", method="lora", timing=False)
    assert next_step(fits) is None


def test_the_estimate_face_prints_the_next_step() -> None:
    r = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "estimate", "Qwen/Qwen2.5-7B-Instruct",
                        "--method", "qlora", "--gpu", "rtx-4060", "--json"], capture_output=True, text=True,
                       timeout=120)
    d = json.loads(r.stdout)
    assert r.returncode == 1 and d["next_step"]["change"]["field"] == "framework"
    env = {**os.environ, "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "estimate", "Qwen/Qwen2.5-7B-Instruct",
                        "--method", "qlora", "--gpu", "rtx-4060"], capture_output=True, text=True,
                       timeout=120, env=env)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("DOES NOT FIT") and "next step" in lines[1] and "--framework" in r.stdout
