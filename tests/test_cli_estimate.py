"""The CLI as a user runs it: exit codes, JSON keys, clear errors, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tuneplan

# the package these tests imported, so the CLI under test is this checkout's
SRC = str(Path(tuneplan.__file__).resolve().parents[1])


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuneplan.cli.app", *args], capture_output=True, text=True,
                          timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "COLUMNS": "160",
                               "PYTHONPATH": SRC})


def test_estimate_json_keys_and_exit_0() -> None:
    r = run("estimate", "Qwen/Qwen2.5-7B-Instruct", "--method", "qlora", "--rank", "16", "--batch", "1",
            "--seq", "512", "--gpu", "rtx4090", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["model"]["name"] == "Qwen/Qwen2.5-7B-Instruct"
    assert d["model"]["params_total"] == 7_615_616_512
    assert d["model"]["params_trainable"] > 0
    pg = d["per_gpu"]
    for k in ("allocated_peak_bytes", "reserved_peak_bytes", "device_peak_bytes", "components"):
        assert k in pg
    assert sum(pg["components"].values()) == pg["allocated_peak_bytes"]
    assert d["peak_instant"] in pg["instants"]
    assert d["gpu"]["name"] and d["gpu"]["memory_bytes"] > 20 * 2**30
    assert d["fits"] is True and d["headroom_bytes"] > 0
    assert isinstance(d["findings"], list)


def test_estimate_table_output() -> None:
    r = run("estimate", "qwen2.5-7b-instruct", "--method", "qlora", "--gpu", "4090")
    assert r.returncode == 0, r.stderr
    for word in ("weights", "logits_loss", "allocated peak", "reserved peak", "device peak", "FITS"):
        assert word in r.stdout


def test_does_not_fit_exit_1() -> None:
    r = run("estimate", "meta-llama/Llama-2-70b-hf", "--method", "full", "--gpu", "rtx4090")
    assert r.returncode == 1
    assert "DOES NOT FIT" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (("estimate", "qwen2.5-7x"), "did you mean"),
    # with --json the failure is one error object naming the field, with the suggestions
    (("estimate", "qwen2.5-7x", "--json"), '"field": "model"'),
    (("estimate", "qwen2.5-7x", "--json"), '"suggestions": ["qwen/qwen2.5-7b"'),
    (("estimate", "qwen2.5-7b", "--gpu", "rtx9999"), "gpu"),
    (("estimate", "qwen2.5-7b", "--batch", "0"), "batch"),
    (("estimate", "qwen2.5-7b", "--method", "full", "--bits", "4"), "bits"),
    (("estimate", "qwen2.5-7b", "--zero", "2"), "zero"),
    (("estimate", "qwen2.5-7b", "--method", "sideways"), "method"),
    (("estimate", "qwen2.5-7b", "--batch", "many"), "batch"),
])
def test_bad_input_exit_2_no_traceback(args, needle) -> None:
    r = run(*args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert needle.lower() in (r.stderr + r.stdout).lower()


def test_malformed_config_file(tmp_path) -> None:
    p = tmp_path / "config.json"
    p.write_text('{"model_type": "llama", "hidden_size": 64}')
    r = run("estimate", str(p))
    assert r.returncode == 2 and "num_hidden_layers" in r.stderr and "Traceback" not in r.stderr


def test_models_and_table() -> None:
    r = run("models", "--json")
    assert r.returncode == 0
    d = json.loads(r.stdout)
    assert list(d) == ["models"] and len(d["models"]) >= 40  # one object, never a bare list
    t = run("table", "--json")
    assert t.returncode == 0
    d = json.loads(t.stdout)
    assert list(d) == ["table"]
    cells = d["table"]
    assert len(cells) == 16
    by = {(c["size"], c["method"]): c["device_peak_bytes"] for c in cells}
    for size in ("7B", "13B", "30B/32B", "70B"):  # computed ordering, not copied numbers
        assert (by[(size, "QLoRA 4-bit")] < by[(size, "QLoRA 8-bit")] < by[(size, "LoRA 16-bit")]
                < by[(size, "full 16-bit")])
