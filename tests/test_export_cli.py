"""`tuneplan export` as a user runs it: files and companions written, never overwritten without --force."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuneplan.cli.app", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                                     "COLUMNS": "160", "PYTHONPATH": str(ROOT / "src")})


def test_writes_yaml_and_deepspeed_companion(tmp_path: Path) -> None:
    out = tmp_path / "run" / "lora.yaml"
    r = run("export", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora", "--rank", "32", "--gpus", "4",
            "--zero", "3", "--format", "llamafactory", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["files"] == [str(out), str(out.parent / "ds_z3_config.json")]
    cfg = yaml.safe_load(out.read_text())
    assert cfg["deepspeed"] == "ds_z3_config.json" and cfg["lora_rank"] == 32
    ds = json.loads((out.parent / "ds_z3_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 3 and ds["train_batch_size"] == 4


def test_never_overwrites_without_force(tmp_path: Path) -> None:
    out = tmp_path / "train.py"
    args = ("export", "qwen2.5-0.5b", "--method", "lora", "--format", "hf-script", "-o", str(out))
    assert run(*args).returncode == 0
    out.write_text("# mine\n")
    r = run(*args)
    assert r.returncode == 2 and "already exist" in r.stderr and "Traceback" not in r.stderr
    assert out.read_text() == "# mine\n"
    r = run(*args, "--force")
    assert r.returncode == 0 and out.read_text().startswith("#!/usr/bin/env python3")


def test_companion_counts_as_existing(tmp_path: Path) -> None:
    (tmp_path / "ds_z2_config.json").write_text("{}")
    r = run("export", "qwen2.5-0.5b", "--gpus", "2", "--zero", "2", "--format", "accelerate",
            "-o", str(tmp_path / "acc.yaml"))
    assert r.returncode == 2 and "ds_z2_config.json" in r.stderr
    assert not (tmp_path / "acc.yaml").exists()  # nothing written when any target exists


def test_stdout_when_one_file(tmp_path: Path) -> None:
    r = run("export", "qwen2.5-0.5b", "--gpus", "2", "--zero", "2", "--format", "deepspeed")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["zero_optimization"]["stage"] == 2
    r = run("export", "qwen2.5-0.5b", "--gpus", "2", "--zero", "2", "--format", "hf-script")
    assert r.returncode == 2 and "-o" in r.stderr  # a script + its DeepSpeed JSON need a folder


def test_export_from_a_config(tmp_path: Path) -> None:
    out = tmp_path / "train.py"
    r = run("export", "--from", str(ROOT / "examples" / "qwen2.5-7b-qlora.yaml"), "--format", "hf-script",
            "-o", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "'model': 'Qwen/Qwen2.5-7B-Instruct'" in text and "'max_length': 1024" in text
    assert "'gradient_accumulation_steps': 8" in text
    assert "llamafactory profile" in r.stdout  # the recipe runs HF code: said, not hidden


def test_bad_format_and_unrunnable_plan_exit_2(tmp_path: Path) -> None:
    r = run("export", "qwen2.5-0.5b", "--format", "megatron", "-o", str(tmp_path / "x"))
    assert r.returncode == 2 and "format" in r.stderr
    r = run("export", "qwen2.5-7b-instruct", "--method", "qlora", "--precision", "bf16-mixed",
            "--gpu", "v100-32gb", "--format", "hf-script", "-o", str(tmp_path / "t.py"))
    assert r.returncode == 2 and "cannot run" in r.stderr and "Traceback" not in r.stderr


def test_a_plan_that_does_not_fit_is_written_with_a_warning(tmp_path: Path) -> None:
    from tuneplan.api import estimate
    from tuneplan.catalog.accelerators import resolve_accelerator
    from tuneplan.catalog.models import resolve_model
    from tuneplan.export import build_export
    from tuneplan.specs.setup import TrainSetup

    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    big = build_export("hf-script", estimate(spec, TrainSetup(method="full", sources={"method": "flag"}),
                                             gpu=resolve_accelerator("rtx4090")), str(tmp_path / "train.py"))
    assert any("does NOT fit" in n for n in big.notes)
    small = build_export("hf-script", estimate(spec, TrainSetup(method="lora", sources={"method": "flag"}),
                                               gpu=resolve_accelerator("a100-80gb")),
                         str(tmp_path / "train.py"))
    assert not any("does NOT fit" in n for n in small.notes)
