"""The HF training script: it compiles for every plan, and a LoRA plan trains one real step on the CPU
on a tiny random model built from a config (no download). bitsandbytes is not installed here, so the
QLoRA variant is compile-checked and must stop with a clear message on the CPU."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuneplan.api import estimate
from tuneplan.errors import TuneplanError
from tuneplan.export import build_export
from tuneplan.export.hf_script import script_plan
from tuneplan.specs.model import model_from_config
from tuneplan.specs.setup import TrainSetup

from .conftest import TINY_LLAMA

PLANS = [
    dict(method="qlora", rank=16, seq=1024),
    dict(method="qlora", bits=8, optimizer="paged-adamw-8bit", attn="flash"),
    dict(method="lora", targets="all-linear", gpus=4, zero=3),
    dict(method="full", gpus=8, fsdp=True, offload="all", gradient_checkpointing=True),
    dict(method="freeze", freeze_trainable_layers=2, precision="fp16-mixed"),
    dict(method="full", precision="bf16", gpus=2, zero=2, offload="optimizer", optimizer="adamw"),
]


def plan_of(text: str) -> dict:
    """The PLAN dict of a generated script, read back with ast (not by importing it)."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PLAN":
            return ast.literal_eval(node.value)
    raise AssertionError("no PLAN")


@pytest.mark.parametrize("plan", PLANS)
def test_script_compiles_and_carries_the_plan(qwen7b, plan, tmp_path: Path) -> None:
    b = build_export("hf-script", estimate(qwen7b, TrainSetup(**plan)), tmp_path / "train.py")
    text = b.files[0][1]
    compile(text, "train.py", "exec")
    p = plan_of(text)
    s = b.setup
    assert p["model"] == qwen7b.name and p["method"] == s.method
    assert p["per_device_train_batch_size"] == s.batch and p["max_length"] == s.seq
    assert p["gradient_accumulation_steps"] == s.grad_accum
    assert p["gradient_checkpointing"] == s.gradient_checkpointing
    assert p["attn_implementation"] == {"sdpa": "sdpa", "flash": "flash_attention_2",
                                        "eager": "eager"}[s.attn]
    assert (p["deepspeed"] is not None) == bool(s.zero)
    if s.zero:
        assert [f.name for f, _ in b.files] == ["train.py", f"ds_z{s.zero}_config.json"]
    assert ("offload" in p["fsdp"]) == (s.fsdp and s.offload == "all")
    # -mixed: autocast in the compute dtype; a full fine-tune then keeps fp32 weights (master)
    assert p["bf16"] == s.precision.startswith("bf16") and p["fp16"] == s.precision.startswith("fp16")
    if s.method == "full" and s.precision.endswith("-mixed"):
        assert p["load_dtype"] == "float32"


def test_qlora_script_quantizes_and_prepares(qwen7b) -> None:
    text = build_export("hf-script", estimate(qwen7b, TrainSetup(method="qlora", rank=16)),
                        "train.py").files[0][1]
    p = plan_of(text)
    assert (p["bits"], p["quant_type"], p["double_quant"], p["compute_dtype"]) == (4, "nf4", True, "bfloat16")
    # PEFT's default for Qwen2, resolved by the hf profile
    assert p["lora"]["targets"] == ["q_proj", "v_proj"]
    assert "BitsAndBytesConfig(" in text and "prepare_model_for_kbit_training(" in text
    assert "Needs: pip install" in text and "bitsandbytes" in text


def test_targets_are_resolved_names_of_the_architecture(qwen7b) -> None:
    p = script_plan(qwen7b, TrainSetup(method="lora", targets="mlp", optimizer="adamw", attn="sdpa",
                                       gradient_checkpointing=False, dropout=0.0))
    assert p["lora"]["targets"] == ["gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize("plan,field", [
    (dict(optimizer_in_backward=True), "optimizer_in_backward"),
    (dict(method="full", precision="fp16"), "precision"),
])
def test_refusals(qwen7b, plan, field) -> None:
    with pytest.raises(TuneplanError) as e:
        build_export("hf-script", estimate(qwen7b, TrainSetup(**plan)), "train.py")
    assert e.value.field == field


def _run(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300,
                          cwd=script.parent, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
                                                  "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "2"})


def test_lora_script_trains_one_step_on_cpu(tmp_path: Path) -> None:
    for mod in ("torch", "transformers", "peft"):
        pytest.importorskip(mod, reason="the simulate extra installs the training stack")
    model = model_from_config(TINY_LLAMA, "tiny-llama")
    setup = TrainSetup(method="lora", rank=8, targets="q_proj,v_proj", batch=2, seq=32, grad_accum=2,
                       gradient_checkpointing=True)
    b = build_export("hf-script", estimate(model, setup), tmp_path / "train.py")
    for p, text in b.files:
        p.write_text(text)
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    r = _run(tmp_path / "train.py", "--model-config", "config.json", "--dataset", "random:8",
             "--max-steps", "1", "--output-dir", "out")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    summary = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("tuneplan-summary "))
                         .split(" ", 1)[1])
    # r (d_in + d_out) per adapted module, 4 layers: q_proj 256->256, v_proj 256->64 (2 KV heads x 32)
    assert summary["trainable_params"] == 4 * 8 * ((256 + 256) + (256 + 64)) == 26_624
    assert summary["global_step"] == 1 and summary["train_loss"] > 0
    assert (tmp_path / "out" / "adapter_model.safetensors").exists()
    adapter = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and set(adapter["target_modules"]) == {"q_proj", "v_proj"}


def test_qlora_script_stops_clearly_without_a_gpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    model = model_from_config(TINY_LLAMA, "tiny-llama")
    b = build_export("hf-script", estimate(model, TrainSetup(method="qlora", seq=32)), tmp_path / "train.py")
    b.files[0][0].write_text(b.files[0][1])
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    r = _run(tmp_path / "train.py", "--model-config", "config.json", "--dataset", "random:4", "--cpu")
    assert r.returncode != 0 and "QLoRA needs a CUDA GPU" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("offload", ["none", "all"])
def test_fsdp_plan_reaches_the_trainer_as_estimated(qwen7b, version, offload) -> None:
    """The Trainer's own FSDP parsing (transformers' TrainingArguments) must end with the FSDP version the
    estimate assumed, and under FSDP1 with BACKWARD_PRE prefetch: the Trainer's defaults (FSDP2 in
    transformers 5, NO_PREFETCH) differ, so the script must say both."""
    transformers = pytest.importorskip("transformers")
    from tuneplan.export import train_script

    setup = TrainSetup(method="lora", gpus=2, fsdp=True, fsdp_version=version, offload=offload)
    p = plan_of(build_export("hf-script", estimate(qwen7b, setup), Path("train.py")).files[0][1])
    args = transformers.TrainingArguments(output_dir="out", fsdp=p["fsdp"], use_cpu=True, report_to="none",
                                          fsdp_config=train_script.fsdp_config(p, True))
    got = args.fsdp_plugin_args
    assert got["fsdp_version"] == version
    assert got.get("cpu_offload", False) == (offload == "all")
    assert got["activation_checkpointing"] is True
    if version == 1:
        assert got["backward_prefetch"] == "BACKWARD_PRE" and got["use_orig_params"] is True
        assert got["reshard_after_forward"] == "full_shard"
    else:
        assert got["reshard_after_forward"] is True


def test_a_moe_scripts_all_linear_lists_the_linear_names() -> None:
    """PEFT given the literal "all-linear" on Qwen3-MoE (a type it converts for transformers 5) would also
    adapt the fused experts and the router, which the estimate's all-linear leaves alone; so the script
    lists the names the estimate adapted: Qwen3-MoE's nn.Linear layers are the attention projections
    (q/k/v/o_proj); its experts are 3-D parameters and its router is not an nn.Linear."""
    from tuneplan.catalog.models import resolve_model

    model = resolve_model("Qwen/Qwen3-30B-A3B")
    plan = script_plan(model, TrainSetup(method="lora", targets="all-linear"))
    assert sorted(plan["lora"]["targets"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    dense = script_plan(model_from_config(TINY_LLAMA), TrainSetup(method="lora", targets="all-linear"))
    assert dense["lora"]["targets"] == "all-linear"
