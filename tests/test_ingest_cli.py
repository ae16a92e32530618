"""`--from` on the command line: the README command, model from the file, clear errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CFG = ROOT / "tests" / "fixtures" / "configs"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuneplan.cli.app", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "COLUMNS": "160"})


def test_readme_command() -> None:
    r = run("estimate", "--from", "examples/qwen2.5-7b-qlora.yaml", "--gpu", "rtx4090")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Resolved setup" in out and "qwen2.5-7b-qlora.yaml:17" in out  # lora_rank's line
    assert "Qwen/Qwen2.5-7B-Instruct" in out and "FITS" in out


def test_json_carries_the_files_and_origins() -> None:
    r = run("estimate", "--from", "examples/qwen2.5-7b-qlora.yaml", "--rank", "32", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["from"]["files"] == [{"path": "examples/qwen2.5-7b-qlora.yaml", "kind": "llamafactory"}]
    assert d["setup"]["rank"] == 32 and d["setup_sources"]["rank"] == "flag"
    assert d["setup_sources"]["seq"] == "llamafactory yaml examples/qwen2.5-7b-qlora.yaml:23"
    assert d["setup_sources"]["optimizer"] == "llamafactory profile default"


def test_yaml_plus_deepspeed_equals_flags_on_the_cli() -> None:
    a = run("estimate", "--from", str(CFG / "llamafactory" / "qwen2.5_lora_explicit_ds.yaml"),
            "--gpu", "a100-80gb", "--json")
    b = run("estimate", "Qwen/Qwen2.5-7B-Instruct", "--framework", "llamafactory", "--method", "lora",
            "--rank", "32", "--targets", "q_proj,k_proj,v_proj,o_proj", "--seq", "4096", "--batch", "2",
            "--grad-accum", "4", "--precision", "bf16-mixed", "--attn", "flash", "--zero", "2", "--gpus", "4",
            "--gpu", "a100-80gb", "--json")
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    da, db = json.loads(a.stdout), json.loads(b.stdout)
    assert da["per_gpu"] == db["per_gpu"] and da["setup"] == db["setup"]


def test_no_model_anywhere_is_exit_2() -> None:
    r = run("estimate", "--from",
            str(CFG / "llamafactory" / "examples" / "deepspeed" / "ds_z2_offload_config.json"),
            "--gpus", "2")
    assert r.returncode == 2
    assert "model" in r.stderr and "Traceback" not in r.stderr + r.stdout
    r = run("estimate")
    assert r.returncode == 2 and "model" in r.stderr


def test_malformed_file_exit_2_with_file_and_line() -> None:
    r = run("estimate", "--from", str(CFG / "bad" / "bad_indent.yaml"))
    assert r.returncode == 2
    assert "bad_indent.yaml:3" in r.stderr and "Traceback" not in r.stderr + r.stdout


def test_warnings_are_printed(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nfinetuning_type: lora\nbf16: true\nuse_dora: true\n")
    r = run("estimate", "--from", str(f))
    assert r.returncode == 0, r.stderr
    assert "use_dora" in r.stdout and "not modelled" in r.stdout
