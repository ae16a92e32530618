"""`fit` when nothing fits with the setup's own framework: other frameworks' candidates, and the next step.

The expected choices are derived by hand from what each framework keeps (cited below) and checked
with plain ``tuneplan.estimate`` calls, never with the planner's own search.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

from tuneplan.api import estimate
from tuneplan.catalog.models import resolve_model
from tuneplan.plan import fit

GIB = 2**30
LLAMA7B = "meta-llama/Llama-2-7b-hf"
QWEN7B = "Qwen/Qwen2.5-7B"
# 7B QLoRA at 8,192 tokens on an 8 GB RTX 4060 with nothing offloaded: the 4-bit base is ~3.5 GiB, but
# under HF's model code each of the 32 layers keeps its checkpointed input (8,192 x 4,096 bf16 = 64 MiB)
# and the loss builds 8,192 x 32,000 logits: the sequence, not the weights, is what does not fit.
QLORA_8K = {"method": "qlora", "seq": 8192, "offload": "none"}


def _hf_fits_any(**fields: object) -> bool:
    """A plain loop over the space with nothing offloaded: both bit widths, every optimizer and
    checkpointing choice, micro-batch 1."""
    for bits, opt, gc in itertools.product((4, 8), (None, "adamw-8bit", "paged-adamw-8bit"), (False, True)):
        kw = {"optimizer": opt} if opt else {}
        e = estimate(LLAMA7B, gpu="rtx-4060", framework="hf", bits=bits, batch=1, grad_accum=1,
                     gradient_checkpointing=gc, timing=False, **{**QLORA_8K, **kw, **fields})
        if e.fits:
            return True
    return False


def test_7b_qlora_at_8k_on_a_4060_is_answered_with_unsloth_labelled() -> None:
    assert not _hf_fits_any()  # hand-derived above; the estimator agrees
    r = fit(LLAMA7B, "rtx-4060", host_memory_gib=64, **QLORA_8K)
    # Unsloth offloads the checkpointed layer inputs to the host (use_gradient_checkpointing="unsloth")
    # and fuses the loss (no logits tensor): both sequence-long terms leave the card.
    assert r.framework["chosen"] == "unsloth" and r.framework["default"] == "hf"
    assert not r.framework["pinned"] and "unsloth" in r.framework["searched"]
    rec = r.recommended
    assert rec is not None and rec["setup"]["framework"] == "unsloth"
    assert "--framework unsloth" in rec["command"]
    assert {c["framework"] for c in r.candidates} == {"unsloth"}
    assert r.next_step is None
    s = rec["setup"]
    again = estimate(LLAMA7B, gpu="rtx-4060", framework="unsloth", method="qlora", bits=s["bits"],
                     seq=8192, offload="none", batch=rec["micro_batch"], grad_accum=rec["grad_accum"],
                     optimizer=s["optimizer"], gradient_checkpointing=s["gradient_checkpointing"],
                     timing=False)
    assert again.fits and again.breakdown.device_peak_bytes == rec["device_peak_bytes"]


def test_a_pinned_framework_gets_the_longest_sequence_that_fits() -> None:
    r = fit(LLAMA7B, "rtx-4060", host_memory_gib=64, framework="hf", **QLORA_8K)
    assert r.recommended is None and r.framework["searched"] == ["hf"]
    step = r.next_step
    assert step is not None and step["short_of"] == "device" and step["short_by_bytes"] > 0
    ch = step["change"]
    assert ch is not None and ch["field"] == "seq" and ch["from"] == 8192
    # the boundary, by the plain loop: something fits at the new length, nothing one token longer
    assert _hf_fits_any(seq=ch["to"]) and not _hf_fits_any(seq=ch["to"] + 1)
    # the largest component is read off the reference estimate itself (most sparing: 4-bit, paged
    # 8-bit AdamW, checkpointing on)
    ref = estimate(LLAMA7B, gpu="rtx-4060", framework="hf", bits=4, batch=1, grad_accum=1,
                   optimizer="paged-adamw-8bit", gradient_checkpointing=True, timing=False, **QLORA_8K)
    comps = ref.breakdown.components
    assert step["largest_component"] == max(comps, key=lambda k: comps[k])
    # short by what the verdict is judged on (the device peak less the segments the allocator frees)
    assert step["short_by_bytes"] == ref.breakdown.device_needed_bytes - ref.gpu.memory_bytes


def test_full_7b_on_a_4060_with_hf_needs_16_bytes_per_parameter_of_host_memory() -> None:
    # Everything offloaded (FSDP / ZeRO-3 CPU offload) leaves the card a few GiB, but mixed-precision
    # AdamW keeps fp32 master weights (4 B), fp32 gradients (4 B) and two fp32 moments (8 B) per
    # parameter in host memory: 16 B x 7.62e9 = 113.5 GiB (ZeRO, arXiv 1910.02054, section 3.1: 16 psi).
    r = fit(QWEN7B, "rtx-4060", method="full", framework="hf", host_memory_gib=64)
    assert r.recommended is None
    step = r.next_step
    assert step is not None and step["short_of"] == "host" and step["largest_component"] is None
    ch = step["change"]
    params = resolve_model(QWEN7B).params_total
    assert ch is not None and ch["field"] == "host_memory" and ch["to"] == -(-params * 16 // GIB) == 114
    assert fit(QWEN7B, "rtx-4060", method="full", framework="hf", host_memory_gib=114).recommended
    assert fit(QWEN7B, "rtx-4060", method="full", framework="hf", host_memory_gib=113).recommended is None


def test_full_7b_on_a_4060_without_a_framework_takes_torchtune_pure_bf16() -> None:
    # torchtune trains in pure bf16: bf16 weights (2 B), gradients (2 B) and AdamW moments (4 B) per
    # parameter, 8 x 7.62e9 = 56.7 GiB, within a 64 GiB host; HF's 16 B per parameter is not.
    r = fit(QWEN7B, "rtx-4060", method="full", host_memory_gib=64)
    rec = r.recommended
    assert rec is not None and r.framework["chosen"] in ("torchtune", "torchtune-0.2")
    assert rec["setup"]["offload"] == "all"
    params = resolve_model(QWEN7B).params_total
    assert rec["host_bytes"] * rec["world_size"] <= 64 * GIB < params * 16


def test_the_fit_face_prints_the_next_step_and_its_json() -> None:
    env = {**os.environ, "COLUMNS": "100"}
    args = [sys.executable, "-m", "tuneplan", "fit", LLAMA7B, "--gpu", "rtx-4060", "--method", "qlora",
            "--seq", "8192", "--offload", "none", "--framework", "hf", "--host-memory", "64"]
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "Nothing fits" in r.stdout and "Traceback" not in r.stderr
    j = subprocess.run([*args, "--json"], capture_output=True, text=True, env=env, timeout=120)
    d = json.loads(j.stdout)
    assert f"next step: --seq {d['next_step']['change']['to']}" in " ".join(r.stdout.split())
    assert d["next_step"]["largest_component"] in r.stdout


def test_the_fit_face_names_the_framework_it_took() -> None:
    env = {**os.environ, "COLUMNS": "200"}
    args = [sys.executable, "-m", "tuneplan", "fit", LLAMA7B, "--gpu", "rtx-4060", "--method", "qlora",
            "--seq", "8192", "--offload", "none", "--host-memory", "64"]
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert "framework unsloth: nothing fits with hf" in r.stdout and "--framework unsloth" in r.stdout


def test_a_hard_limit_that_rules_out_every_plan_is_not_called_nothing_fits() -> None:
    from tuneplan.plan.timecost import make_dataset

    ds = make_dataset(samples=10_000, avg_tokens=512)
    r = fit("Qwen/Qwen2.5-0.5B", "rtx4090", dataset=ds, max_hours=0.001, host_memory_gib=64)
    assert r.recommended is None and any(m.fits for m in r.methods)
    assert r.next_step is None  # memory is not what is short
    assert r.framework["default_decided_by"] == "max_hours"
    env = {**os.environ, "COLUMNS": "200"}
    args = [sys.executable, "-m", "tuneplan", "fit", "Qwen/Qwen2.5-0.5B", "--gpu", "rtx4090", "--samples",
            "10000", "--avg-tokens", "512", "--max-hours", "0.001", "--host-memory", "64"]
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 1 and "No plan within the limits" in out.stdout
    assert "Nothing fits" not in out.stdout
