"""`tuneplan fit | gpus | max-model | sweep` as a user runs them: JSON shapes, exit codes, errors."""

from __future__ import annotations

import json
import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuneplan.cli.app", *args], capture_output=True, text=True,
                          timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "COLUMNS": "200"})


def test_fit_json() -> None:
    r = run("fit", "Qwen/Qwen2.5-7B", "--gpu", "rtx4090", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [m["method"] for m in d["methods"]] == ["full", "freeze", "lora", "qlora-8", "qlora-4"]
    for m in d["methods"]:
        assert {"method", "fits", "max_batch", "max_seq", "max_rank", "requires", "setup"} <= set(m)
    # the default objective (balanced): the most faithful method (full, LoRA, QLoRA 8, QLoRA 4, freeze)
    # whose tokens/s is within 2x of the fastest row that adapts every layer (all but freeze)
    rows = {m["method"]: m["tokens_per_second"] for m in d["methods"] if m["fits"] and not m["tight"]}
    fastest = max(v for k, v in rows.items() if k != "freeze")
    want = next(k for k in ("full", "lora", "qlora-8", "qlora-4", "freeze")
                if k in rows and rows[k] * 2 >= fastest)
    assert d["prefer"] == "balanced" and d["recommended"]["method"] == want
    assert d["recommended"]["reason"]


def test_fit_table_and_one_method() -> None:
    r = run("fit", "Qwen/Qwen2.5-7B", "--gpu", "rtx4090", "--method", "qlora", "--bits", "4", "--seq", "1024",
            "--global-batch", "32")
    assert r.returncode == 0, r.stderr
    assert "qlora-4" in r.stdout and "Recommended" in r.stdout and "global batch 32" in r.stdout
    assert "full" not in r.stdout.split("Recommended")[0].split("method")[1]


def test_fit_nothing_fits_exits_1_and_bad_card_exits_2() -> None:
    r = run("fit", "meta-llama/Llama-3.1-405B-Instruct", "--gpu", "rtx-3060-12gb", "--method", "full")
    assert r.returncode == 1 and "Nothing fits" in r.stdout
    r = run("fit", "Qwen/Qwen2.5-7B", "--gpu", "rtx9999")
    assert r.returncode == 2 and "gpu" in r.stderr and "Traceback" not in r.stderr


def test_gpus_json_and_list() -> None:
    r = run("gpus", "Qwen/Qwen2.5-14B", "--method", "lora", "--only", "rtx4090,a100-80gb,h100", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["ranking"]) == 3
    for c in d["ranking"]:
        assert {"gpu", "fits", "min_gpus", "per_gpu_peak_bytes", "total_hours", "cloud_usd"} <= set(c)
    r = run("gpus", "--list")
    assert r.returncode == 0 and "a100-80gb-sxm4" in r.stdout
    r = run("gpus", "--list", "--json")
    cards = json.loads(r.stdout)["accelerators"]
    assert r.returncode == 0 and "a100-80gb-sxm4" in {c["id"] for c in cards}
    r = run("gpus", "Qwen/Qwen2.5-14B", "--sort", "price")
    assert r.returncode == 2 and "sort" in r.stderr


def test_max_model_json() -> None:
    r = run("max-model", "--gpu", "a100-80gb", "--gpus", "8", "--method", "full", "--zero", "3", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["largest_catalog_model"]["fits"] and d["max_params"] > 10e9
    assert [m["method"] for m in d["by_method"]] == ["full", "freeze", "lora", "qlora-8", "qlora-4"]


def test_sweep_table_json_and_html_plot(tmp_path) -> None:
    out = tmp_path / "s.html"
    r = run("sweep", "Qwen/Qwen2.5-7B", "--method", "qlora", "--vary", "seq=512..4096", "--gpu", "rtx4090",
            "--plot", str(out))
    assert r.returncode == 0, r.stderr
    assert out.exists() and "<svg" in out.read_text(encoding="utf-8")
    assert "device peak" in r.stdout
    r = run("sweep", "Qwen/Qwen2.5-7B", "--vary", "batch=1..4", "--json")
    d = json.loads(r.stdout)
    assert [p["value"] for p in d["points"]] == [1, 2, 4]
    r = run("sweep", "Qwen/Qwen2.5-7B", "--vary", "lr=1..2")
    assert r.returncode == 2 and "vary" in r.stderr
