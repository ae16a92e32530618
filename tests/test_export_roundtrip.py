"""Round trip: export a plan, read the files back with --from, get the same estimate.

Only what a format cannot hold is given back as flags: a DeepSpeed JSON says nothing about the model or
LoRA, an accelerate YAML nothing about the batch; LLaMA-Factory's YAML holds everything but the GPU
count, which the launcher decides (its DeepSpeed companion's train_batch_size carries it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneplan.api import estimate
from tuneplan.export import build_export
from tuneplan.ingest import read_configs
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.setup import TrainSetup

LORA = {"rank", "targets", "dropout"}
MODEL_SIDE = {"method", "precision", "optimizer", "batch", "seq", "grad_accum", "gradient_checkpointing",
              "attn", "framework"}


def carried(fmt: str, s: TrainSetup) -> set[str]:
    """The fields the exported files must carry themselves (not given back as flags)."""
    if fmt == "deepspeed":
        return {"zero", "offload", "batch", "grad_accum", "gpus", "precision"}
    if fmt == "accelerate":
        out = {"gpus", "nodes", "zero", "fsdp", "offload"}
        if s.fsdp:
            out.add("fsdp_version")
        if s.zero:
            out |= {"batch", "grad_accum"}  # from the DeepSpeed JSON it points at
        if s.precision.endswith("-mixed"):
            out.add("precision")
        return out
    out = set(MODEL_SIDE)
    if s.is_lora:
        out |= LORA
    if s.method == "qlora":
        out |= {"bits"}
    if s.method == "freeze":
        out.add("freeze_trainable_layers")
    if s.loss:
        out.add("loss")
    if s.compile:
        out.add("compile")
    if s.zero:
        out |= {"zero", "offload", "gpus"}
    if s.fsdp:
        out |= {"fsdp", "offload", "gpus", "nodes"}
    return out


PLANS = [
    dict(method="qlora", rank=16, batch=2, seq=1024, grad_accum=8),
    dict(method="qlora", bits=8, targets="attn", rank=8, seq=2048, attn="flash",
         optimizer="paged-adamw-8bit"),
    dict(method="lora", rank=32, targets="q_proj,k_proj,v_proj,o_proj", batch=4, seq=2048, gpus=4, zero=3),
    dict(method="full", batch=1, seq=2048, gpus=8, zero=3, offload="all", optimizer="adamw"),
    dict(method="full", batch=2, seq=512, gpus=2, zero=2, offload="optimizer", precision="fp16-mixed",
         optimizer="adamw-fused"),
    dict(method="lora", batch=1, seq=4096, gpus=4, fsdp=True, offload="all", gradient_checkpointing=True),
    dict(method="lora", batch=1, seq=2048, gpus=2, fsdp=True, fsdp_version=2),
    dict(method="freeze", freeze_trainable_layers=3, batch=2, seq=1024, precision="bf16"),
    dict(method="lora", batch=2, seq=512, gpus=2, nodes=2, zero=2),
    dict(method="full", batch=1, seq=512, precision="fp32", optimizer="sgd"),
    dict(method="lora", framework="llamafactory", batch=2, seq=1024, gpus=2),
    dict(method="lora", batch=2, seq=2048, loss="fused-linear", compile=True),
]
CASES = [(fmt, plan) for fmt in ("llamafactory", "deepspeed", "accelerate") for plan in PLANS
         if not (fmt == "deepspeed" and not plan.get("zero"))]


@pytest.mark.parametrize("fmt,plan", CASES)
def test_export_then_from_gives_the_same_estimate(qwen7b, fmt: str, plan: dict, tmp_path: Path) -> None:
    b = build_export(fmt, estimate(qwen7b, TrainSetup(**plan)), tmp_path / "recipe")
    for p, text in b.files:
        p.write_text(text)
    s = b.setup  # what the files encode (LLaMA-Factory's recipe is estimated with its own profile)
    must = carried(fmt, s)
    files = [str(b.files[0][0])]
    if fmt == "llamafactory" and s.fsdp:
        files.append(str(b.files[1][0]))  # launched with its accelerate companion
    flags = {k: v for k, v in s.to_dict().items() if k not in must}
    r = read_configs(files, flags, qwen7b.name if fmt != "llamafactory" else None)
    assert r.model == qwen7b.name
    from_file = {k for k, src in r.sources.items() if src != "flag"}
    assert must <= from_file, must - from_file
    for k in must:
        got, want = r.setup_kw[k], getattr(s, k)
        if k == "targets":
            assert resolve_targets(qwen7b, got) == resolve_targets(qwen7b, want)
        elif k == "precision" and s.zero:  # DeepSpeed keeps 16-bit weights + fp32 master either way
            assert got.removesuffix("-mixed") == want.removesuffix("-mixed")
        else:
            assert got == want, k
    a = estimate(qwen7b, s)
    b2 = estimate(qwen7b, r.base_setup(), **r.setup_kw)
    assert b2.breakdown == a.breakdown
    assert b2.trainable_params == a.trainable_params
