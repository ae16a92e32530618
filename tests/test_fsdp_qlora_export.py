"""`tuneplan export --format fsdp-qlora`: every flag of the emitted ``python train.py`` line is one of
train.py's own parameters, with a value its parser takes (tests/fixtures/fsdp_qlora_train_args.json: the
``main()`` signature of train.py at the commit it names), and the values are the plan's."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tuneplan.api import build_setup, estimate
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.export import build_export
from tuneplan.export.fsdp_qlora import train_py_flags
from tuneplan.specs.setup import TrainSetup

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "fsdp_qlora_train_args.json").read_text())
ARGS = FIXTURE["arguments"]
LLAMA2_7B = "meta-llama/Llama-2-7b-hf"
BOOL_WORDS = ("true", "false")  # fastcore str2bool takes these (and 1/0, yes/no, any case)

PLANS = [
    dict(method="qlora", gpus=2, fsdp=True),
    dict(method="qlora", gpus=2, fsdp=True, offload="all", batch=2, seq=2048, grad_accum=4),
    dict(method="lora", gpus=2, fsdp=True, gradient_checkpointing=False, rank=8, alpha=32, dropout=0.0),
    dict(method="lora", gpus=2, targets="q_proj,v_proj"),  # PEFT's default for Llama -> "default"
    dict(method="full", gpus=4, fsdp=True, precision="bf16-mixed"),
    dict(method="qlora", gpus=1, precision="fp16-mixed", optimizer="sgd"),
    dict(method="qlora", gpus=2, fsdp=True, activation_offload=True, precision="fp32"),
]


def _flags(model: str = LLAMA2_7B, dataset: str | None = None, **kw: object) -> dict[str, str]:
    spec = resolve_model(model, allow_network=False)
    setup = build_setup(spec, framework="fsdp-qlora", **kw)
    return dict(train_py_flags(spec, setup, dataset))


def _parses(name: str, value: str) -> bool:
    arg = ARGS[name]
    kind = arg["type"]
    if kind == "choice":
        return value in arg["choices"]
    if kind in ("bool_arg", "bool"):
        return value in BOOL_WORDS
    try:
        {"int": int, "float": float, "str": str}[kind](value)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
def test_every_flag_is_a_train_py_parameter_with_a_value_it_parses(plan: dict) -> None:
    flags = _flags(**plan)
    for name, value in flags.items():
        assert name in ARGS, f"--{name} is not a parameter of train.py @ {FIXTURE['commit'][:7]}"
        assert _parses(name, value), f"--{name} {value}"


def test_the_values_are_the_plans() -> None:
    f = _flags(method="qlora", gpus=2, fsdp=True, offload="all", batch=3, seq=1024, grad_accum=4)
    assert (f["train_type"], f["batch_size"], f["context_length"], f["gradient_accumulation_steps"]) == \
        ("qlora", "3", "1024", "4")
    assert (f["sharding_strategy"], f["use_cpu_offload"], f["world_size"]) == ("full_shard", "true", "2")
    # the profile's defaults, which are train.py's own
    assert (f["lora_rank"], f["lora_dropout"], f["lora_target_modules"], f["precision"], f["optimizer"]) == \
        ("64", "0.1", "all", "bf16", "adamw")
    assert f["reentrant_checkpointing"] == "true"  # train.py README: with bitsandbytes
    assert _flags(method="lora", gpus=2, targets="q_proj,v_proj")["lora_target_modules"] == "default"
    assert _flags(method="lora", gpus=2)["sharding_strategy"] == "ddp"  # FSDP NO_SHARD
    assert _flags(method="qlora", gpus=1, precision="bf16-mixed")["precision"] == "bf16_autocast"
    assert _flags(method="qlora", gpus=2, fsdp=True, dataset="alpaca")["dataset"] == "alpaca"


@pytest.mark.parametrize(("kw", "field"), [
    (dict(model="Qwen/Qwen2.5-7B-Instruct", method="qlora", gpus=2, fsdp=True), "model"),
    (dict(method="qlora", gpus=2, zero=3), "zero"),
    (dict(method="qlora", gpus=2, fsdp=True, attn="flash"), "attn"),
    (dict(method="lora", gpus=2, fsdp=True, targets="q_proj,o_proj"), "targets"),
    (dict(method="qlora", gpus=2, fsdp=True, optimizer="adamw-8bit"), "optimizer"),
    (dict(method="lora", gpus=2, fsdp=True, precision="fp16"), "precision"),
    (dict(method="qlora", gpus=2, fsdp=True, bits=8), "bits"),
    (dict(method="qlora", gpus=2, fsdp=True, offload="optimizer"), "offload"),
    (dict(method="freeze", gpus=2, fsdp=True), "method"),
    (dict(method="qlora", gpus=2, fsdp=True, dataset="my.jsonl"), "dataset"),
])
def test_what_train_py_cannot_run_is_refused_naming_the_field(kw: dict, field: str) -> None:
    with pytest.raises(TuneplanError) as e:
        _flags(**kw)
    assert e.value.field == field


def test_bundle_is_one_script_estimated_with_the_profile(tmp_path: Path) -> None:
    spec = resolve_model(LLAMA2_7B, allow_network=False)
    b = build_export("fsdp-qlora", estimate(spec, TrainSetup(framework="fsdp-qlora", method="qlora")),
                     tmp_path / "run.sh")
    assert [p.name for p, _ in b.files] == ["run.sh"] and b.setup.framework == "fsdp-qlora"
    text = b.files[0][1]
    assert text.startswith("#!/usr/bin/env bash\n") and "python train.py \\\n" in text
    assert text.rstrip().endswith("--dataset dummy")


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "export", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=os.fspath(ROOT))


def test_cli_writes_an_executable_script(tmp_path: Path) -> None:
    out = tmp_path / "run_fsdp_qlora.sh"
    plan = ("--format", "fsdp-qlora", "--method", "qlora", "--gpus", "2", "--fsdp", "--json")
    r = _cli(LLAMA2_7B, *plan, "--framework", "fsdp-qlora", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files"] == [str(out)]
    assert out.stat().st_mode & stat.S_IXUSR
    r2 = _cli("Qwen/Qwen2.5-7B-Instruct", *plan)
    assert r2.returncode == 2 and "Traceback" not in r2.stderr
    assert json.loads(r2.stdout)["error"]["field"] == "model"
