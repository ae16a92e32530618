"""Regression guard (not a correctness test): ``tuneplan.estimate(...).to_dict()`` over a few hundred varied
setups, written by the code itself, to check that a refactoring changes no figure.

    python tools/golden_estimates.py write /tmp/golden.json   # before the change
    python tools/golden_estimates.py check /tmp/golden.json   # after: byte-identical JSON or a diff
    python tools/golden_estimates.py check /tmp/golden.json --rename peak_phase=peak_instant,phases=instants

``--rename old=new,...`` renames those keys of the old file (at any depth) before the comparison, so a
change that renames keys proves that every value stayed the same.

The setups are drawn by a fixed pseudo-random walk over catalog models x methods x frameworks x batch /
seq / checkpointing / attention / precision / parallelism, plus the agreement cases' analytic breakdowns
(benchmarks/agreement.py), so the expected values are only as right as the code that wrote them.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

MODELS = ["Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.2-1B",
          "meta-llama/Llama-2-7b-hf", "google/gemma-2b", "mistralai/Mixtral-8x7B-v0.1", "Qwen/Qwen3-30B-A3B",
          "microsoft/Phi-3-mini-4k-instruct", "meta-llama/Llama-3.1-70B-Instruct", "openai-community/gpt2",
          "microsoft/phi-2", "EleutherAI/pythia-6.9b", "google-bert/bert-large-uncased",
          "deepseek-ai/DeepSeek-V2-Lite", "google/gemma-2-9b"]
GPUS = [None, "rtx4090", "a100-80gb", "h100-80gb", "t4"]


def _setups(n: int = 400) -> list[tuple[str, str | None, dict[str, Any]]]:
    rng = random.Random(20261201)
    out = []
    for _ in range(n):
        kw: dict[str, Any] = {
            "method": rng.choice(["full", "freeze", "lora", "qlora"]),
            "framework": rng.choice(["hf", "hf", "llamafactory", "unsloth", "torchtune", "torchtune-0.2",
                                     "litgpt"]),
            "batch": rng.choice([1, 2, 3, 4, 8, 16]),
            "seq": rng.choice([128, 512, 1000, 2048, 4096, 8192]),
        }
        if rng.random() < 0.5:
            kw["gradient_checkpointing"] = rng.random() < 0.5
        if rng.random() < 0.4:
            kw["attn"] = rng.choice(["eager", "sdpa", "flash"])
        if rng.random() < 0.4:
            kw["precision"] = rng.choice(["fp32", "fp16-mixed", "bf16-mixed", "fp16", "bf16"])
        if kw["method"] in ("lora", "qlora"):
            kw["rank"] = rng.choice([4, 8, 16, 64])
            if rng.random() < 0.3:
                kw["targets"] = rng.choice(["all-linear", "attn", "mlp"])
        if rng.random() < 0.3:
            kw["grad_accum"] = rng.choice([2, 4])
        if rng.random() < 0.3:
            kw["optimizer"] = rng.choice(["adamw", "adamw-fused", "adamw-hf", "adamw-8bit",
                                          "paged-adamw-8bit", "adafactor", "sgd"])
        r = rng.random()
        if r < 0.15:
            kw.update(gpus=rng.choice([2, 4, 8]), zero=rng.choice([1, 2, 3]))
        elif r < 0.25:
            kw.update(gpus=rng.choice([2, 8]), fsdp=True)
        elif r < 0.32:
            kw.update(gpus=rng.choice([2, 4]))
        if rng.random() < 0.1:
            kw["loss"] = rng.choice(["upcast", "chunked", "fused", "fused-linear"])
        if rng.random() < 0.05:
            kw["num_labels"] = 2
        out.append((rng.choice(MODELS), rng.choice(GPUS), kw))
    return out + _rare_switches()


def _rare_switches(n: int = 250) -> list[tuple[str, str | None, dict[str, Any]]]:
    """Setups that also turn on the less common switches (compile, offload, dropout, old-torch behaviours)."""
    rng = random.Random(1117)
    out = []
    for _ in range(n):
        kw: dict[str, Any] = {
            "method": rng.choice(["full", "freeze", "lora", "qlora"]),
            "framework": rng.choice(["hf", "llamafactory", "unsloth", "torchtune", "torchtune-0.2",
                                     "litgpt"]),
            "batch": rng.choice([1, 2, 4]), "seq": rng.choice([256, 1024, 4096]),
            "gradient_checkpointing": rng.random() < 0.5,
            "precision": rng.choice(["fp32", "fp16-mixed", "bf16-mixed", "bf16"]),
            "attn": rng.choice(["eager", "sdpa", "flash"]),
        }
        if kw["method"] in ("lora", "qlora"):
            kw["targets"] = rng.choice(["all-linear", "attn", "mlp"])
            kw["dropout"] = rng.choice([0.0, 0.05])
            kw["rank"] = rng.choice([8, 32])
        for flag in ("compile", "activation_offload", "longest_batch_first", "keep_grads",
                     "softmax_keeps_input",
                     "optimizer_in_backward"):
            if rng.random() < 0.2:
                kw[flag] = True
        if rng.random() < 0.2:
            kw["grad_accum"] = 4
        if rng.random() < 0.2:
            kw["num_labels"] = rng.choice([1, 3])
        if rng.random() < 0.15:
            kw["loss"] = rng.choice(["upcast", "chunked", "fused", "fused-linear"])
        if kw["method"] == "freeze" and rng.random() < 0.5:
            kw["freeze_trainable_layers"] = rng.choice([1, 4])
        out.append((rng.choice(MODELS), rng.choice(GPUS), kw))
    return out


def _agreement_cases() -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from agreement import CASES
    from tuneplan.api import build_setup
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.memory import memory_breakdown
    from tuneplan.specs.model import model_from_config

    out = {}
    for case in CASES:
        spec = resolve_model(case.model)
        if case.layers:
            cfg = dict(spec.config)
            cfg["num_hidden_layers"] = case.layers
            spec = model_from_config(cfg, name=f"{case.model}[{case.layers}L]")
        out[case.label] = memory_breakdown(spec, build_setup(spec, **case.setup)).to_dict()
    return out


def collect() -> dict[str, Any]:
    import tuneplan
    from tuneplan.errors import TuneplanError

    rows = []
    for model, gpu, kw in _setups():
        try:
            d = tuneplan.estimate(model, gpu=gpu, **kw).to_dict()
        except TuneplanError as e:
            d = {"error": str(e)}
        rows.append({"model": model, "gpu": gpu, "setup": kw, "result": d})
    return {"estimates": rows, "agreement_analytic": _agreement_cases()}


def renamed(value: Any, names: dict[str, str]) -> Any:
    """``value`` (parsed JSON) with every dict key found in ``names`` replaced by its new name."""
    if isinstance(value, dict):
        return {names.get(k, k): renamed(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [renamed(v, names) for v in value]
    return value


def dumped(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=True, default=str)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] not in ("write", "check"):
        print(__doc__)
        print("usage: python tools/golden_estimates.py {write,check} PATH [--rename old=new,...]")
        return 0 if any(a in ("-h", "--help") for a in argv[1:]) else 2
    mode, path = argv[1], Path(argv[2])
    names: dict[str, str] = {}
    if len(argv) > 4 and argv[3] == "--rename":
        names = dict(pair.split("=", 1) for pair in argv[4].split(","))
    text = dumped(collect())
    if mode == "write":
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
        return 0
    old = path.read_text(encoding="utf-8")
    if names:
        old = dumped(renamed(json.loads(old), names))
    if old == text:
        print("identical" + (f" (keys renamed: {', '.join(f'{k} -> {v}' for k, v in names.items())})"
                             if names else ""))
        return 0
    import difflib

    diff = difflib.unified_diff(old.splitlines(True), text.splitlines(True), "before", "after")
    sys.stdout.writelines(list(diff)[:80])
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
