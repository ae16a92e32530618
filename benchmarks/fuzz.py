"""Hostile-input fuzzing of the tuneplan CLI: generated invocations, run in process, each under a time bound.

Names, numbers, flag mixes and files an attacker or a careless user would try (YAML alias bombs,
100,000-level nesting, binary files, NaN/inf, huge and negative sizes, symbolic links planted as output
paths, empty files, BOMs) are drawn from a seeded generator. Every invocation must:

- exit 0, 1 or 2 (3 is an internal error: a crash the last line of defence caught);
- print no traceback;
- with ``--json``, print one JSON value on stdout that a strict parser accepts (no NaN / Infinity);
- write nothing outside its output folder: the link targets folder and the input files are unchanged;
- finish within the time bound: CPU seconds of the invocation (a loaded machine does not make a hang),
  with a wall-clock alarm at 6x the bound for one that blocks (a hang is reported as such).

    python benchmarks/fuzz.py --n 20000 [--seed 1] [--timeout 10]

prints counts of each failure kind, the rate, and the first examples of each. ``tests/test_fuzz.py`` runs
a few thousand of the same invocations in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# an org/name is looked up in the local cache only: no network in a fuzz run
os.environ["HF_HUB_OFFLINE"] = "1"

CARDS = ["l4", "l20", "a100", "a100-80gb", "h100", "t4", "rtx4090", "v100", "910b", "mi300x", "h200", "3090"]
MODELS = ["qwen2.5-3b", "qwen2.5-7b", "Qwen/Qwen2.5-0.5B", "llama-3.1-8b", "gpt2", "mixtral-8x7b",
          "deepseek-v3", "google-bert/bert-large-uncased", "qwen2.5-0.5b", "phi-3-mini"]
NUMBERS = ["nan", "NaN", "inf", "-inf", "Infinity", "-1", "0", "-0", "1e308", "1e309", "-1e308",
           "99999999999999999999999", "9" * 400, "0.5", "1.5", "1e-320", "", " ", "abc", "0x10", "1_000",
           "\u0663", "4", "8", "16", "2", "3", "7", "1", "65537", "2147483648", "1e9", "-2147483649", "1.0"]
NAMES = ["a" * 300, "a" * 5000, "~nosuchuser/x", "~", "/", ".", "..", "../../etc/passwd", "/etc/passwd",
         "etc/passwd", "/dev/zero", "/dev/null", "/proc/self/environ", "org/" + "x" * 200, "org/name",
         "Qwen/",
         "/nonexistent/config.json", "x.json", "\U0001f999", "\u202eevil", "name with spaces", "-", "--",
         "qwen2.5-3b\n", "NUL\x00byte", "%s%n", "$(id)", "`id`", "' OR 1=1 --", "C:\\Users\\x\\N", "\ud800",
         "qwen2.5-3b" * 30, "QWEN2.5-3B", " qwen2.5-3b ", "..json", ".json", "/tmp", "h" * 255, "h" * 256]
CHOICES = {
    "--method": ["full", "freeze", "lora", "qlora"], "--bits": ["4", "8"], "--quant-type": ["nf4", "fp4"],
    "--precision": ["fp32", "fp16-mixed", "bf16-mixed", "fp16", "bf16"],
    "--optimizer": ["adamw", "adamw-8bit", "paged-adamw-8bit", "adafactor", "sgd"],
    "--attn": ["eager", "sdpa", "flash"], "--loss": ["upcast", "chunked", "fused", "fused-linear"],
    "--offload": ["none", "optimizer", "all"], "--zero": ["0", "1", "2", "3"],
    "--framework": ["hf", "llamafactory", "unsloth", "torchtune", "torchtune-0.2", "litgpt"],
    "--targets": ["all-linear", "attn", "mlp", "q_proj,v_proj", "nosuch", ",,,", "a" * 5000],
}
INT_FLAGS = ["--rank", "--alpha", "--batch", "--seq", "--grad-accum", "--gpus", "--nodes", "--num-labels",
             "--samples", "--dataset-tokens"]
FLOAT_FLAGS = ["--dropout", "--epochs", "--avg-tokens", "--price", "--card-price", "--kwh-price",
               "--own-years"]
BOOL_FLAGS = ["--gradient-checkpointing", "--no-gradient-checkpointing", "--fsdp", "--packing", "--compile",
              "--activation-offload", "--double-quant"]
DEPLOY_FLAGS = {"--serve-precision": ["bf16", "fp16", "int8", "int4", "int3"], "--context": NUMBERS,
                "--concurrency": NUMBERS, "--tp": NUMBERS, "--gpu-util": NUMBERS, "--prefill-tokens": NUMBERS,
                "--kv-dtype": ["bf16", "fp8", "int2"], "--cards": NUMBERS,
                "--quant-method": ["gptq", "awq", "bnb", "gguf-q4_k_m", "x"], "--mla-cache": ["latent", "x"]}
TINY = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 1000}
MOE = {"model_type": "deepseek_v3", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
       "intermediate_size": 688, "vocab_size": 1000, "n_routed_experts": 8, "num_experts_per_tok": 2,
       "moe_layer_freq": 1, "moe_intermediate_size": 128, "kv_lora_rank": 64, "qk_rope_head_dim": 16,
       "qk_nope_head_dim": 32, "v_head_dim": 32, "first_k_dense_replace": 1}
# Architectures transformers' own constructors refuse (or cannot build): the fuzz asserts only the contract
# (exit 0/1/2, no traceback, strict JSON), whatever the estimator decides about each.
MIXTRAL = {"model_type": "mixtral", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
           "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 1000, "num_local_experts": 8,
           "num_experts_per_tok": 2}
QWEN2_MOE = {"model_type": "qwen2_moe", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
             "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 1000, "num_experts": 8,
             "num_experts_per_tok": 2, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 256,
             "decoder_sparse_step": 1}
IMPOSSIBLE = {
    "kv_more_than_heads": {**TINY, "num_key_value_heads": 16},
    "heads_not_divisible_by_kv": {**TINY, "num_key_value_heads": 3},
    "hidden_not_divisible_by_heads": {**TINY, "hidden_size": 250},
    "gpt2_hidden_by_heads": {"model_type": "gpt2", "n_embd": 250, "n_layer": 2, "n_head": 12,
                             "vocab_size": 1000},
    "bert_hidden_by_heads": {"model_type": "bert", "hidden_size": 250, "num_hidden_layers": 2,
                             "num_attention_heads": 12, "intermediate_size": 512, "vocab_size": 1000},
    "mixtral_one_expert_top2": {**MIXTRAL, "num_local_experts": 1},
    "mixtral_top_k_past_experts": {**MIXTRAL, "num_experts_per_tok": 9},
    "qwen2_moe_sparse_step_past_layers": {**QWEN2_MOE, "decoder_sparse_step": 5},
    "qwen2_moe_sliding_window_0": {**QWEN2_MOE, "sliding_window": 0, "use_sliding_window": False},
}
# Multimodal configs: the language model inside, and a vision tower the estimate must count or refuse.
VISION = {"model_type": "clip_vision_model", "hidden_size": 1024, "num_hidden_layers": 24,
          "num_attention_heads": 16, "intermediate_size": 4096, "image_size": 336, "patch_size": 14}
MULTIMODAL = {
    "llava": {"model_type": "llava", "text_config": {**TINY}, "vision_config": VISION,
              "projector_hidden_act": "gelu", "image_token_index": 999},
    "blip2": {"model_type": "blip-2", "num_query_tokens": 32,
              "text_config": {"model_type": "opt", "hidden_size": 256, "num_hidden_layers": 2,
                              "num_attention_heads": 8, "ffn_dim": 1024, "vocab_size": 1000},
              "vision_config": {"hidden_size": 1408, "num_hidden_layers": 39, "num_attention_heads": 16,
                                "intermediate_size": 6144},
              "qformer_config": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12}},
    "idefics2": {"model_type": "idefics2", "text_config": {**TINY, "model_type": "mistral"},
                 "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27,
                                   "num_attention_heads": 16, "intermediate_size": 4304},
                 "perceiver_config": {"resampler_n_latents": 64}},
    "llava_empty_vision": {"model_type": "llava", "text_config": {**TINY}, "vision_config": {}},
    "llava_no_text": {"model_type": "llava", "vision_config": VISION},
}
JSON_VALUES = ["NaN", "Infinity", "-Infinity", "-1", "0", "1000000000", "1" + "0" * 400, "1e308", "-14336",
               '"str"', "[]", "{}", "null", "true", "1.5", "4096", "2"]


@dataclass
class Env:
    """The scratch folders of one run: inputs, output folder, link targets, working directory."""

    root: Path
    files: dict[str, list[str]] = field(default_factory=dict)  # kind -> paths

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def out(self) -> Path:
        return self.root / "work" / "out"

    @property
    def outside(self) -> Path:
        return self.root / "outside"


def _write(p: Path, data: str | bytes) -> str:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    return str(p)


def _config_text(base: dict[str, Any], rng: random.Random) -> str:
    """A config.json with 1-3 fields replaced by hostile raw JSON values (NaN, huge, negative, wrong type)."""
    items = {k: json.dumps(v) for k, v in base.items()}
    for k in rng.sample(sorted(base), rng.randint(1, 3)):
        if k != "model_type":
            items[k] = rng.choice(JSON_VALUES)
    return "{" + ", ".join(f'"{k}": {v}' for k, v in items.items()) + "}"


BOMB = "a: &a [" + ", ".join(['"lol"'] * 9) + "]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))


def make_env(root: Path, rng: random.Random) -> Env:
    """Write the hostile files once per run (a few hundred; the generator picks among them)."""
    env = Env(root)
    f = root / "files"
    env.outside.mkdir(parents=True)
    _write(env.outside / "victim.txt", "the user's own file\n")
    env.out.mkdir(parents=True)
    cfg: list[str] = []
    for i in range(60):
        cfg.append(_write(f / f"cfg{i}" / "config.json", _config_text(rng.choice([TINY, MOE]), rng)))
    cfg.append(_write(f / "deep.json", "[" * 100_000 + "]" * 100_000))
    cfg.append(_write(f / "deep_obj.json", '{"a":' * 50_000 + "1" + "}" * 50_000))
    cfg.append(_write(f / "layers.json", json.dumps({**TINY, "num_hidden_layers": 10**9})))
    cfg.append(_write(f / "neg.json", json.dumps({**TINY, "intermediate_size": -14336})))
    cfg.append(_write(f / "moe0.json", json.dumps({**MOE, "moe_layer_freq": 0})))
    cfg.append(_write(f / "heads.json",
                      json.dumps({**TINY, "num_attention_heads": 4096, "num_key_value_heads": 1})))
    cfg.append(_write(f / "wide.json", json.dumps({**TINY, "hidden_size": 131072, "vocab_size": 4194304,
                                                   "num_hidden_layers": 2048, "intermediate_size": 1048576})))
    cfg.append(_write(f / "bom.json", "\ufeff" + json.dumps(TINY)))
    cfg.append(_write(f / "list.json", "[1, 2]"))
    cfg.append(_write(f / "type.json", json.dumps({**TINY, "model_type": ["llama"]})))
    cfg.append(_write(f / "text.json",
                      json.dumps({"model_type": "gemma3", "text_config": {**TINY, "hidden_size": -1}})))
    for name, arch in IMPOSSIBLE.items():
        cfg.append(_write(f / "impossible" / f"{name}.json", json.dumps(arch)))
    for name, arch in MULTIMODAL.items():
        cfg.append(_write(f / "multimodal" / f"{name}.json", json.dumps(arch)))
    common: list[str] = []
    common.append(_write(f / "binary.json", bytes(rng.randrange(256) for _ in range(2000))))
    common.append(_write(f / "binary.yaml", b"\xff\xfe\x00\x81" * 100))
    common.append(_write(f / "empty.json", ""))
    common.append(_write(f / "empty.yaml", ""))
    common.append(_write(f / "space.yaml", "   \n\n"))
    common.append(_write(f / "big.json", " " * (5 * 1024 * 1024) + "{}"))
    common.append(_write(f / "brace.json", "{" * 200_000))
    common.append(_write(f / "nul.yaml", "a: 1\x00\n"))
    os.symlink(env.outside / "victim.txt", f / "link_victim.json")
    os.symlink(root / "nowhere.json", f / "dangling.json")
    os.symlink(f / "loop_b.json", f / "loop_a.json")
    os.symlink(f / "loop_a.json", f / "loop_b.json")
    os.symlink("/dev/zero", f / "zero.json")
    common += [str(f / n) for n in ("link_victim.json", "dangling.json", "loop_a.json", "zero.json")]
    common.append(str(f / "cfg0"))  # a folder
    frm: list[str] = []
    frm.append(_write(f / "bomb.yaml", BOMB + "model_name_or_path: qwen2.5-3b\n"))
    frm.append(_write(f / "recursive.yaml", "a: &a [*a]\nmodel_name_or_path: qwen2.5-3b\n"))
    frm.append(_write(f / "merge.yaml",
                      "base: &b {x: 1}\nc: {<<: *b, y: 2}\nmodel_name_or_path: qwen2.5-3b\n"))
    frm.append(_write(f / "deep.yaml", "[" * 100_000 + "]" * 100_000))
    frm.append(_write(f / "deep_block.yaml",
                      "".join("  " * i + "a:\n" for i in range(400)) + "  " * 400 + "1\n"))
    frm.append(_write(f / "multi.yaml", "a: 1\n---\nb: 2\n"))
    frm.append(_write(f / "keys.yaml", "? [1, 2]\n: x\n1: 2\nnull: 3\n"))
    frm.append(_write(f / "tags.yaml", "a: !!python/object:os.system ls\n"))
    frm.append(_write(f / "bom.yaml",
                      "\ufeffmodel_name_or_path: qwen2.5-3b\nstage: sft\nfinetuning_type: lora\n"))
    lf_keys = ["cutoff_len", "per_device_train_batch_size", "gradient_accumulation_steps", "quantization_bit",
               "lora_rank", "num_train_epochs", "max_steps", "max_samples", "lora_dropout", "deepspeed",
               "finetuning_type", "bf16", "lora_target", "model_name_or_path", "freeze_trainable_layers"]
    yaml_values = [".nan", ".inf", "-.inf", "-1", "0", "1e308", "7", "9" * 400, "[]", "{}", "~", "yes", "'x'",
                   "*nope", "16", "4", "true", "'" + "a" * 300 + "'", "\"~nosuchuser/x\"", "/etc/passwd"]
    for i in range(60):
        lines = {"model_name_or_path": "qwen2.5-3b", "stage": "sft", "finetuning_type": "lora",
                 "cutoff_len": "512"}
        for k in rng.sample(lf_keys, rng.randint(1, 3)):
            lines[k] = rng.choice(yaml_values)
        frm.append(_write(f / f"lf{i}.yaml", "".join(f"{k}: {v}\n" for k, v in lines.items())))
    ds_keys = ["train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization"]
    for i in range(20):
        d = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
        text = json.dumps(d)
        k = rng.choice(ds_keys)
        text = text[:-1] + f', "{k}": {rng.choice(JSON_VALUES)}' + "}"
        frm.append(_write(f / f"ds{i}.json", text))
    hw: list[str] = []
    hw_values = ["nan", "inf", "-inf", "-1", "0", "1e308", "1e9", "'x'", "[1]", "true", "80", "2"]
    hw_keys = ["memory_gib", "memory_gb", "bf16_tflops", "bandwidth_gbs", "tdp_w", "devices_per_package",
               "release_year", "cloud_usd_per_hr", "compute_capability"]
    for i in range(30):
        body = "[accelerators.x]\nvendor = 'nvidia'\nmemory_gib = 24\n"
        for k in rng.sample(hw_keys, rng.randint(1, 3)):
            body += f"{k} = {rng.choice(hw_values)}\n"
        hw.append(_write(f / f"hw{i}.toml", body.replace("memory_gib = 24\nmemory_gib", "memory_gib")))
    hw.append(_write(f / "hw_bomb.yaml", BOMB + "accelerators: {}\n"))
    hw.append(_write(f / "hw_deep.toml", "a = " + "[" * 50_000 + "]" * 50_000 + "\n"))
    hw.append(_write(f / "hw_keys.yaml", "accelerators:\n  1: {vendor: nvidia}\n  null: 2\n"))
    hw.append(_write(f / "hw_bad.txt", "x"))
    machine: list[str] = []
    dev = {"index": 0, "kind": "cuda", "name": "NVIDIA A100-SXM4-80GB", "memory_total_bytes": 85899345920,
           "compute_capability": "8.0"}
    for i in range(30):
        d = json.dumps({"devices": [dev], "driver_version": "550.54", "versions": {"torch": "2.4.0"}})
        k = rng.choice(["index", "kind", "name", "memory_total_bytes", "compute_capability",
                        "memory_free_bytes"])
        d = d.replace(f'"{k}": ', f'"{k}": {rng.choice(JSON_VALUES)}, "_{k}": ', 1)
        machine.append(_write(f / f"m{i}.json", d))
    machine.append(_write(f / "m_list.json", "[1, 2, 3]"))
    machine.append(_write(f / "m_nan.yaml", "devices:\n  - {name: x, memory_total_bytes: .nan}\n"))
    machine.append(_write(f / "m_devs.json", json.dumps({"devices": {"a": 1}})))
    machine.append(_write(f / "m_versions.json", json.dumps({"versions": {"torch": {"a": [1, {}]}}})))
    machine.append(_write(f / "m_cc.json",
                          json.dumps({"devices": [{"name": "x", "compute_capability": [1e400, "a"]}]})
                          .replace("Infinity", "1e400")))
    env.files = {"config": cfg, "common": common, "from": frm, "hardware": hw, "machine": machine}
    return env


def _number(rng: random.Random) -> str:
    return rng.choice(NUMBERS)


def _model(rng: random.Random, env: Env) -> str:
    r = rng.random()
    if r < 0.4:
        return rng.choice(MODELS)
    if r < 0.6:
        return rng.choice(NAMES)
    return rng.choice(env.files["config"] + env.files["common"])


def _output(rng: random.Random, env: Env, suffix: str) -> str:
    """An output path: fresh, existing, a link to the outside (dangling or not), a folder, a long name."""
    out = env.out
    kind = rng.randrange(8)
    name = f"o{rng.randrange(10**6)}{suffix}"
    if kind == 0:
        p = out / name
        p.write_text("existing user file\n")
        return str(p)
    if kind == 1:
        p = out / name
        os.symlink(env.outside / f"planted{rng.randrange(10**6)}{suffix}", p)  # dangling, pointing outside
        return str(p)
    if kind == 2:
        p = out / name
        os.symlink(env.outside / "victim.txt", p)
        return str(p)
    if kind == 3:
        return str(out)  # a folder
    if kind == 4:
        return str(out / ("n" * 300 + suffix))
    if kind == 5:
        return str(out / "sub" / "deeper" / name)
    return str(out / name)


def invocation(rng: random.Random, env: Env) -> list[str]:
    """One command line: a command, its positional input, and 0-5 random flags with hostile values."""
    cmd = rng.choice(["estimate", "estimate", "estimate", "fit", "gpus", "max-model", "sweep", "table",
                      "export", "export", "deploy", "deploy", "doctor", "models", "accelerators",
                      "accelerators"])
    args = [cmd]
    if cmd in ("estimate", "fit", "gpus", "sweep", "deploy", "export"):
        if cmd in ("estimate", "fit", "export") and rng.random() < 0.3:
            args += ["--from", rng.choice(env.files["from"] + env.files["common"])]
            if rng.random() < 0.5:
                args.append(_model(rng, env))
        else:
            args.append(_model(rng, env))
    if cmd in ("models", "accelerators") and rng.random() < 0.7:
        args.append(rng.choice(NAMES + CARDS))
    if cmd in ("estimate", "fit", "max-model", "sweep", "deploy", "export") and rng.random() < 0.8:
        args += ["--gpu", rng.choice(CARDS) if rng.random() < 0.85 else rng.choice(NAMES)]
    if cmd in ("estimate", "accelerators") and rng.random() < 0.25:
        args += ["--hardware-file", rng.choice(env.files["hardware"] + env.files["common"])]
        if cmd == "estimate":  # the card the file defines
            if "--gpu" in args:
                del args[args.index("--gpu"):args.index("--gpu") + 2]
            args += ["--gpu", "x"]
    if cmd == "doctor":
        args += ["--machine", rng.choice(env.files["machine"] + env.files["common"]), "--no-import-check"]
    if cmd == "sweep":
        args += ["--vary", rng.choice(["seq=512..2048", "rank=8..32:8", "gpus=1,2", "seq=1..1e9",
                                       "rank=nan..inf", "batch=" + ",".join(["1"] * 50), "x=1",
                                       "seq=" + _number(rng), ""])]
        if rng.random() < 0.3:
            args += ["--plot", _output(rng, env, rng.choice([".html", ".svg", ".pdf"]))]
    if cmd == "export":
        args += ["--format", rng.choice(["hf-script", "llamafactory", "deepspeed", "accelerate", "x"])]
        if rng.random() < 0.8:
            args += ["-o", _output(rng, env, rng.choice([".py", ".yaml", ".json"]))]
        if rng.random() < 0.3:
            args += ["--dataset", rng.choice(NAMES)]
    if cmd == "gpus":
        for flag, vals in (("--max-gpus", NUMBERS), ("--top", NUMBERS), ("--sort", ["cost", "time", "x"]),
                           ("--only", CARDS + NAMES)):
            if rng.random() < 0.2:
                args += [flag, rng.choice(vals)]
        if rng.random() < 0.2:
            args.append("--list")
    if cmd == "deploy":
        for flag in rng.sample(sorted(DEPLOY_FLAGS), rng.randint(0, 3)):
            args += [flag, rng.choice(DEPLOY_FLAGS[flag])]
    if cmd in ("estimate", "fit", "gpus", "max-model", "sweep", "export", "deploy"):
        for _ in range(rng.choice([0, 1, 1, 2, 3, 5])):
            r = rng.random()
            if r < 0.35:
                flag = rng.choice(sorted(CHOICES))
                args += [flag, (rng.choice(CHOICES[flag]) if rng.random() < 0.7
                                else rng.choice(NUMBERS + NAMES))]
            elif r < 0.65:
                args += [rng.choice(INT_FLAGS),
                         _number(rng) if rng.random() < 0.7 else str(rng.choice([1, 2, 8, 64]))]
            elif r < 0.9:
                args += [rng.choice(FLOAT_FLAGS), _number(rng)]
            else:
                args.append(rng.choice(BOOL_FLAGS))
        if cmd == "estimate" and rng.random() < 0.3:
            args += ["--samples", rng.choice(["1000", _number(rng)])]
    if rng.random() < 0.5:
        args.append("--json")
    return args


class Hang(BaseException):
    """Raised by the alarm: an invocation ran past its time bound (a BaseException: no handler catches it)."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def _snapshot(*folders: Path) -> dict[str, tuple[int, int, bool]]:
    out: dict[str, tuple[int, int, bool]] = {}
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(folder):
            for n in filenames + dirnames:
                p = os.path.join(dirpath, n)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                out[p] = (st.st_size, st.st_mtime_ns, os.path.islink(p))
    return out


def _strict_json(text: str) -> bool:
    def refuse(name: str) -> Any:
        raise ValueError(name)

    try:
        json.loads(text, parse_constant=refuse)
        return True
    except ValueError:
        return False


@dataclass
class Outcome:
    args: list[str]
    code: int | None
    seconds: float
    problems: list[str]
    stdout: str = ""
    stderr: str = ""
    wall: float = 0.0  # seconds on the clock (``seconds`` is CPU time)


def run_one(args: list[str], env: Env, timeout: float) -> Outcome:
    """Run ``tuneplan ARGS`` in this process (cwd = the work folder) and judge what it did."""
    from tuneplan.cli.app import run

    watched = _snapshot(env.outside, env.root / "files")
    out, err = io.StringIO(), io.StringIO()
    code: int | None = None
    problems: list[str] = []
    # The bound is on the CPU time the invocation uses (ITIMER_PROF), so that a shared, loaded machine does
    # not turn a slow second into a "hang"; a wall-clock alarm at 6x catches one that blocks without work.
    old = signal.signal(signal.SIGALRM, _alarm), signal.signal(signal.SIGPROF, _alarm)
    signal.setitimer(signal.ITIMER_PROF, timeout)
    signal.setitimer(signal.ITIMER_REAL, 6 * timeout)
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run(list(args))
    except Hang:
        problems.append("hang")
    except SystemExit as exc:  # a command that calls sys.exit itself
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - anything escaping run() is a crash
        problems.append(f"escaped {type(exc).__name__}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGALRM, old[0])
        signal.signal(signal.SIGPROF, old[1])
    seconds = time.process_time() - cpu_start
    wall = time.perf_counter() - start
    stdout, stderr = out.getvalue(), err.getvalue()
    if code is not None and code not in (0, 1, 2):
        problems.append(f"exit {code}")
    if "Traceback (most recent call last)" in stdout + stderr:
        problems.append("traceback")
    # after a "--" separator, --json is an argument, not the flag
    if ("--json" in args and "--" not in args and code is not None and not problems
            and not _strict_json(stdout)):
        problems.append("invalid json")
    if _snapshot(env.outside, env.root / "files") != watched:
        problems.append("file outside its folder")
    return Outcome(args, code, seconds, problems, stdout[-2000:], stderr[-2000:], wall)


# ---- the environment: config folders and terminal variables a user's machine may have ----------------
def environment(rng: random.Random, env: Env) -> dict[str, str]:
    """Variables to set for one in-process invocation: a config folder holding a broken or hostile
    hardware file (or a file, or nothing, where the folder should be), and terminal settings."""
    kind = rng.randrange(6)
    folder = env.root / "config" / str(rng.randrange(10**6))
    if kind <= 2:  # a config folder whose hardware file is one of the hostile ones
        folder.mkdir(parents=True)
        src = Path(rng.choice(env.files["hardware"] + env.files["common"]))
        name = rng.choice(["hardware.toml", "hardware.yaml", "hardware.yml"])
        try:
            data = src.read_bytes() if src.is_file() and src.stat().st_size < 10**6 else b"\xff\x00"
        except OSError:
            data = b"\xff\x00"
        (folder / name).write_bytes(data)
        return {"TUNEPLAN_CONFIG_DIR": str(folder)}
    if kind == 3:
        where = [str(env.root / "nowhere"), env.files["common"][0], "", "~"]
        return {"TUNEPLAN_CONFIG_DIR": rng.choice(where)}
    if kind == 4:
        return {"XDG_CONFIG_HOME": rng.choice([str(env.root / "nowhere"), env.files["common"][0]]),
                "TUNEPLAN_CONFIG_DIR": ""}
    return {"COLUMNS": rng.choice(["0", "-5", "abc", "100000", "1"]), "NO_COLOR": "1",
            "TERM": rng.choice(["dumb", "", "xterm-256color"])}


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Any:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- pipes, signals, unwritable and ASCII streams, racing writers: real processes ---------------------
PROCESS_KINDS = ("closed_pipe", "full_disk", "ascii", "sigint", "race")


def _passable(args: list[str]) -> bool:
    """An argument list a process can be given (no NUL, encodable as the file system encodes)."""
    try:
        return all("\x00" not in a and a.encode("utf-8") is not None for a in args)
    except UnicodeEncodeError:
        return False


def _sane(rng: random.Random, env: Env) -> list[str]:
    card, model = rng.choice(CARDS), rng.choice(MODELS[:3] + [env.files["config"][-1]])
    args = rng.choice([["models"], ["accelerators"], ["table"], ["estimate", model, "--gpu", card],
                       ["fit", "qwen2.5-0.5b", "--gpu", card], ["estimate", model, "--details"], ["--help"]])
    return args + (["--json"] if rng.random() < 0.4 and args != ["--help"] else [])


def process_case(rng: random.Random, env: Env) -> Outcome:
    """One invocation as a process under a hostile condition, judged by its exit-status class: a closed
    pipe 0/1/2 quietly, a full disk 0/1/2 and never an internal error, ASCII output decodable as ASCII,
    Ctrl-C 130 (or the signal itself, before the command started), two racing exports one 0 and one 2."""
    import subprocess

    kind = rng.choice(PROCESS_KINDS)
    args = invocation(rng, env) if rng.random() < 0.3 else _sane(rng, env)
    if not _passable(args):
        args = _sane(rng, env)
    cmd = [sys.executable, "-m", "tuneplan", *args]
    penv = {**os.environ, "HF_HUB_OFFLINE": "1"}
    problems: list[str] = []
    start = time.perf_counter()
    code: int | None = None
    stdout = stderr = b""
    try:
        if kind == "closed_pipe":
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=penv, cwd=env.work)
            assert p.stdout is not None
            p.stdout.close()
            stderr = p.communicate(timeout=120)[1]
            code = p.returncode
            if code not in (0, 1, 2) or b"Exception ignored" in stderr:
                problems.append(f"closed pipe: exit {code}")
        elif kind == "full_disk":
            with open("/dev/full", "w") as full:
                r = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, env=penv, cwd=env.work,
                                   timeout=120)
            code, stderr = r.returncode, r.stderr
            if code not in (0, 1, 2) or b"bug in tuneplan" in stderr:
                problems.append(f"full disk: exit {code}")
        elif kind == "ascii":
            r = subprocess.run(cmd, capture_output=True, env={**penv, "PYTHONIOENCODING": "ascii"},
                               cwd=env.work, timeout=120)
            code, stdout, stderr = r.returncode, r.stdout, r.stderr
            if code not in (0, 1, 2) or not (stdout + stderr).isascii():
                problems.append(f"ascii: exit {code}")
        elif kind == "sigint":
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=penv, cwd=env.work)
            time.sleep(rng.uniform(0.5, 2.0))
            p.send_signal(signal.SIGINT)
            stdout, stderr = p.communicate(timeout=120)
            code = p.returncode
            if code not in (0, 1, 2, 130, -signal.SIGINT):
                problems.append(f"sigint: exit {code}")
        else:  # two exports racing for one new path, without --force
            target = env.out / f"race{rng.randrange(10**9)}" / "train.py"
            race = [sys.executable, "-m", "tuneplan", "export", "qwen2.5-0.5b", "-o", str(target)]
            procs = [subprocess.Popen(race, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=penv,
                                      cwd=env.work) for _ in range(2)]
            outs = [q.communicate(timeout=120) for q in procs]
            codes = sorted(q.returncode for q in procs)
            stderr = b"".join(e for _, e in outs)
            code = codes[-1]
            if codes != [0, 2] or sorted(x.name for x in target.parent.iterdir()) != ["train.py"]:
                problems.append(f"race: exits {codes}")
    except subprocess.TimeoutExpired:
        problems.append("hang")
    if b"Traceback (most recent call last)" in stdout + stderr:
        problems.append("traceback")
    wall = time.perf_counter() - start
    return Outcome([f"[{kind}]", *args], code, 0.0, problems, stdout.decode(errors="replace")[-2000:],
                   stderr.decode(errors="replace")[-2000:], wall)


def fuzz(n: int, seed: int, timeout: float, root: Path | None = None,
         report_every: int = 0, process_every: int = 0) -> dict[str, Any]:
    """Run ``n`` invocations; counts of each problem kind, exit codes, rate, and the first examples."""
    rng = random.Random(seed)
    with contextlib.ExitStack() as stack:
        base = (Path(root) if root
                else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tp-fuzz-"))))
        env = make_env(base, rng)
        cwd = os.getcwd()
        os.chdir(env.work)
        stack.callback(os.chdir, cwd)
        counts: Counter[str] = Counter()
        codes: Counter[str] = Counter()
        classes: Counter[str] = Counter()  # invocations of the classes beyond the plain in-process one
        examples: dict[str, list[dict[str, Any]]] = {}
        slowest = slowest_wall = 0.0
        start = time.perf_counter()
        for i in range(n):
            if process_every and i % process_every == process_every - 1:
                o = process_case(rng, env)  # its wall time is bounded by the subprocess timeout
                classes[o.args[0]] += 1
            elif rng.random() < 0.1:
                with _environ(environment(rng, env)):
                    o = run_one(invocation(rng, env), env, timeout)
                classes["environment"] += 1
            else:
                o = run_one(invocation(rng, env), env, timeout)
            codes[str(o.code)] += 1
            slowest = max(slowest, o.seconds)
            if o.seconds > timeout:
                o.problems.append("hang")
            slowest_wall = max(slowest_wall, o.wall)
            if report_every and o.problems:
                print(f"problem {o.problems} (exit {o.code}, {o.seconds:.1f} s CPU): "
                      f"{[a[:80] for a in o.args]}",
                      file=sys.stderr, flush=True)
            for p in dict.fromkeys(o.problems):
                counts[p] += 1
                examples.setdefault(p, [])
                if len(examples[p]) < 5:
                    examples[p].append({"args": [a[:120] for a in o.args], "code": o.code,
                                        "stderr": o.stderr[-600:], "stdout": o.stdout[-300:]})
            if report_every and (i + 1) % report_every == 0:
                print(f"{i + 1} invocations, {time.perf_counter() - start:.0f} s, problems {dict(counts)}",
                      file=sys.stderr, flush=True)
        wall = time.perf_counter() - start
    return {"invocations": n, "seed": seed, "seconds": round(wall, 1), "per_second": round(n / wall, 1),
            "slowest_s": round(slowest, 2), "slowest_wall_s": round(slowest_wall, 2),
            "exit_codes": dict(codes), "classes": dict(classes),
            "tracebacks": counts["traceback"] + sum(v for k, v in counts.items() if k.startswith("exit 3")
                                                    or k.startswith("escaped")),
            "hangs": counts["hang"], "invalid_json": counts["invalid json"],
            "files_outside": counts["file outside its folder"], "problems": dict(counts),
            "examples": examples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds one invocation may take")
    ap.add_argument("--process-every", type=int, default=50,
                    help="every N-th invocation runs as a process under a closed pipe, a full disk, an ASCII "
                         "stream, Ctrl-C or a racing writer (0: none)")
    a = ap.parse_args()
    res = fuzz(a.n, a.seed, a.timeout, report_every=1000, process_every=a.process_every)
    print(json.dumps(res, indent=2))
    sys.exit(0 if not res["problems"] else 1)


if __name__ == "__main__":
    main()
