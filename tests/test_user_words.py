"""What the user reads speaks of the domain: a borrowed price says whose it is, a missing one says so;
no search-tool ids or notes outside the package in the output; Ascend's rows are named as on Ascend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "tuneplan.cli.app", *args], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.parametrize("gpu,lender", [("ascend-910b", "A100 80GB SXM"), ("rtx5880", "RTX 6000 Ada")])
def test_a_borrowed_price_says_whose_it_is_where_it_is_printed(gpu: str, lender: str) -> None:
    # accelerators.json: the 910B's and the RTX 5880's cloud prices are the A100 80GB SXM's and the RTX
    # 6000 Ada's ("proxy: the ... price of this catalog")
    p = run("estimate", "qwen2.5-7b-instruct", "--method", "lora", "--gpu", gpu, "--samples", "1000")
    time_line = next(line for line in p.stdout.splitlines() if line.startswith("Time "))
    assert f"USD rented (priced as {lender})" in time_line
    d = json.loads(run("estimate", "qwen2.5-7b-instruct", "--method", "lora", "--gpu", gpu, "--samples",
                       "1000", "--json").stdout)
    assert d["cost"]["cloud_priced_as"] == lender


def test_a_read_price_and_a_given_price_are_not_borrowed() -> None:
    d = json.loads(run("estimate", "qwen2.5-0.5b", "--gpu", "rtx4090", "--samples", "1000", "--json").stdout)
    assert d["cost"]["cloud_priced_as"] is None
    d = json.loads(run("estimate", "qwen2.5-0.5b", "--gpu", "ascend-910b", "--samples", "1000", "--price",
                       "2", "--json").stdout)
    assert d["cost"]["cloud_priced_as"] is None and d["cost"]["cloud_usd_per_gpu_hour"] == 2


def test_no_price_is_said_rather_than_borrowed() -> None:
    p = run("estimate", "qwen2.5-0.5b", "--gpu", "rtx-4060", "--samples", "1000")  # launch price only
    assert "rented: no price known (--price)" in p.stdout


def test_models_json_and_findings_carry_no_bookkeeping() -> None:
    models = run("models", "--json").stdout
    assert "find_string" not in models and "(id " not in models
    json.loads(models)
    for args in (("--gpu", "v100-sxm2-32gb", "--method", "qlora"),
                 ("--gpu", "ascend-910b", "--method", "lora"), ("--gpu", "rtx4090", "--attn", "flash")):
        out = run("estimate", "google/gemma-7b", *args, "--json").stdout
        assert "compat.md" not in out and "gpus.csv" not in out


@pytest.mark.parametrize("gpu,runtime,collectives", [
    ("ascend-910b", "device runtime", "HCCL"), ("mi300x", "device runtime", "RCCL"),
    ("rtx4090", "CUDA context", "NCCL"),
])
def test_the_rows_outside_pytorch_are_named_for_the_platform(gpu: str, runtime: str,
                                                             collectives: str) -> None:
    out = run("estimate", "qwen2.5-0.5b", "--method", "lora", "--gpu", gpu, "--gpus", "2").stdout
    assert any(line.startswith(runtime + " ") for line in out.splitlines())
    assert any(line.startswith(collectives + " ") for line in out.splitlines())
    other = {"CUDA context", "NCCL"} if gpu != "rtx4090" else {"HCCL", "RCCL"}
    assert not any(line.startswith(w) for w in other for line in out.splitlines())
