"""A setup that does not fit gets its next step: the largest component, one change whose estimate fits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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


def test_sharded_optimizer_states_that_do_not_fit_point_at_cpu_offload() -> None:
    """7B full fine-tune, ZeRO-3 over 4 RTX 4090s: Adam's fp32 master, momentum and variance are 12 bytes per
    parameter, a quarter on each card: 6,738,415,616 x 12 / 4 = 20.2 GB (18.83 GiB), most of a 24 GB card
    before weights and activations. Nothing but moving those states off the card helps: the framework is
    pinned, checkpointing is already on, and a shorter sequence or a smaller micro-batch (already 1 x 512)
    leaves the states as they are. DeepSpeed's offload_optimizer moves them to the host."""
    kw = dict(method="full", zero=3, gpus=4, framework="hf", timing=False)
    est = estimate("meta-llama/Llama-2-7b-hf", gpu="rtx-4090", **kw)
    assert not est.fits
    assert est.breakdown.components["optimizer_states"] == pytest.approx(6_738_415_616 * 12 / 4, rel=0.01)
    step = next_step(est)
    assert step is not None and step["largest_component"] == "optimizer_states"
    ch = step["change"]
    assert ch is not None and (ch["field"], ch["from"], ch["to"]) == ("offload", "none", "optimizer")
    again = estimate("meta-llama/Llama-2-7b-hf", gpu="rtx-4090", offload="optimizer", **kw)
    assert again.fits and again.breakdown.components["optimizer_states"] == 0
    assert again.breakdown.device_peak_bytes == ch["device_peak_bytes"]


def test_checkpointing_off_is_turned_on_before_the_data_is_cut() -> None:
    """Qwen2.5-3B LoRA, 4 x 2048 tokens, checkpointing off: every layer keeps its activations (tens of GiB
    on a 24 GB card); with checkpointing each layer keeps only its input, so the data can stay as given.
    The change is the bare switch on the command line."""
    kw = dict(method="lora", framework="hf", seq=2048, batch=4, timing=False)
    est = estimate("Qwen/Qwen2.5-3B", gpu="rtx-4090", gradient_checkpointing=False, **kw)
    step = next_step(est)
    assert step is not None and step["largest_component"] == "activations"
    ch = step["change"]
    assert ch is not None and (ch["field"], ch["to"]) == ("gradient_checkpointing", True)
    assert estimate("Qwen/Qwen2.5-3B", gpu="rtx-4090", gradient_checkpointing=True, **kw).fits
    env = {**os.environ, "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "estimate", "Qwen/Qwen2.5-3B", "--method",
                        "lora", "--framework", "hf", "--seq", "2048", "--batch", "4",
                        "--no-gradient-checkpointing", "--gpu", "rtx-4090"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 1
    text = " ".join(r.stdout.split())
    assert "--gradient-checkpointing fits" in text and "--gradient-checkpointing True" not in text
