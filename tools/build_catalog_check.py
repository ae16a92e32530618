#!/usr/bin/env python3
"""Instantiate every catalog config on the meta device and count its parameters.

For each entry of ``src/tuneplan/catalog/models/index.json`` this script

* loads the stored ``config.json`` copy,
* builds the matching transformers config with ``AutoConfig.for_model`` (no
  ``trust_remote_code``, no network, no weights),
* instantiates the model under ``torch.device("meta")`` with the Auto class
  that fits the architecture (``AutoModelForCausalLM``,
  ``AutoModelForSeq2SeqLM`` or ``AutoModelForMaskedLM``),
* counts ``sum(p.numel() for p in model.parameters())`` -- ``parameters()``
  yields each ``Parameter`` once, so tied input/output embeddings are counted
  once -- and
* compares the count with ``params_published``.

Two remote-code architectures cannot be built by stock transformers. They are
counted through a stock class with the same tensor shapes, and the record says so:

* ``chatglm`` (THUDM/glm-4-9b-chat) -> ``GlmConfig`` / ``GlmForCausalLM`` (the
  transformers port of the same network: fused QKV with bias, no o-proj bias,
  SwiGLU, RMSNorm, untied head).
* ``internlm2`` -> ``LlamaConfig`` / ``LlamaForCausalLM`` (InternLM2 is Llama
  with fused ``wqkv`` and ``bias: false``).

Usage::

    python tools/build_catalog_check.py                 # print the table
    python tools/build_catalog_check.py --update-index  # also write params_transformers/auto_class
    python tools/build_catalog_check.py --json out.json # machine-readable results
    python tools/build_catalog_check.py --only Qwen/Qwen2.5-7B-Instruct

Exit status is 1 when a config fails to instantiate or when the count disagrees
with ``params_published`` (per ``params_published_kind``) and the entry has no
``notes`` explaining why.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
CATALOG_DIR = REPO_ROOT / "src" / "tuneplan" / "catalog" / "models"
INDEX_PATH = CATALOG_DIR / "index.json"

ENCODER_DECODER_TYPES = {"t5", "mt5", "umt5", "bart", "mbart", "pegasus", "longt5"}
MASKED_LM_TYPES = {"bert", "roberta", "xlm-roberta", "deberta", "deberta-v2", "distilbert", "modernbert"}

# Keys that only describe how the checkpoint is stored / loaded. They do not
# change tensor shapes, and some of them (quantization_config) make
# ``from_config`` try to attach quantizers, so they are removed before building.
STORAGE_ONLY_KEYS = ("quantization_config", "auto_map", "_name_or_path", "_attn_implementation")


def _proxy_chatglm(cfg: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """ChatGLM (GLM-4-9B-chat remote code) -> transformers ``glm`` config."""
    return "glm", {
        "vocab_size": cfg["padded_vocab_size"],
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["ffn_hidden_size"],
        "num_hidden_layers": cfg["num_layers"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": (
            cfg["multi_query_group_num"] if cfg.get("multi_query_attention") else cfg["num_attention_heads"]
        ),
        "head_dim": cfg["kv_channels"],
        "attention_bias": bool(cfg.get("add_qkv_bias", False)),
        "rms_norm_eps": cfg.get("layernorm_epsilon", 1e-5),
        "max_position_embeddings": cfg.get("seq_length", 8192),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "pad_token_id": cfg.get("pad_token_id"),
        "eos_token_id": cfg.get("eos_token_id"),
    }


def _proxy_internlm2(cfg: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """InternLM2 (remote code) -> transformers ``llama`` config with the same shapes."""
    bias = bool(cfg.get("bias", False))
    return "llama", {
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
        "attention_bias": bias,
        "mlp_bias": False,
        "rms_norm_eps": cfg.get("rms_norm_eps", 1e-6),
        "max_position_embeddings": cfg.get("max_position_embeddings", 32768),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "rope_theta": cfg.get("rope_theta", 10000),
    }


PROXIES = {
    "chatglm": ("AutoModelForCausalLM via GlmForCausalLM proxy (chatglm is remote code)",
                _proxy_chatglm),
    "internlm2": ("AutoModelForCausalLM via LlamaForCausalLM proxy (internlm2 is remote code)",
                  _proxy_internlm2),
}


def auto_class_name(model_type: str, cfg: dict[str, Any]) -> str:
    if cfg.get("is_encoder_decoder") or model_type in ENCODER_DECODER_TYPES:
        return "AutoModelForSeq2SeqLM"
    if model_type in MASKED_LM_TYPES:
        return "AutoModelForMaskedLM"
    return "AutoModelForCausalLM"


def count_params(raw_cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import AutoConfig

    cfg = copy.deepcopy(raw_cfg)
    model_type = cfg.get("model_type")
    if not model_type:
        raise ValueError("config has no model_type")

    proxy_note = None
    if model_type in PROXIES:
        proxy_note, fn = PROXIES[model_type]
        build_type, build_kwargs = fn(cfg)
        auto_name = "AutoModelForCausalLM"
    else:
        build_type = model_type
        build_kwargs = {k: v for k, v in cfg.items() if k not in STORAGE_ONLY_KEYS and k != "model_type"}
        auto_name = auto_class_name(model_type, cfg)

    config = AutoConfig.for_model(build_type, **build_kwargs)
    auto_cls = getattr(transformers, auto_name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = auto_cls.from_config(config)

    # parameters() de-duplicates shared Parameter objects: tied weights count once.
    total = sum(p.numel() for p in model.parameters())
    # Same count without de-duplication, to report how many were tied.
    total_with_dupes = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    embed = model.get_input_embeddings()
    embed_params = sum(p.numel() for p in embed.parameters()) if embed is not None else None

    # Some transformers releases tie the LM head even when the checkpoint's
    # config says ``tie_word_embeddings: false`` (transformers 5.x forces it for
    # T5/mT5, whose v1.1 checkpoints ship a separate lm_head). Report what the
    # checkpoint holds in that case as well.
    head_forced_tied = False
    params_if_untied = None
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if (
        raw_cfg.get("tie_word_embeddings") is False
        and out is not None
        and embed is not None
        and getattr(out, "weight", None) is not None
        and out.weight is getattr(embed, "weight", None)
    ):
        head_forced_tied = True
        params_if_untied = int(total + out.weight.numel())
    return {
        "auto_class": proxy_note or auto_name,
        "model_class": type(model).__name__,
        "params_transformers": int(total),
        "tied_params": int(total_with_dupes - total),
        "input_embedding_params": int(embed_params) if embed_params is not None else None,
        "proxy": proxy_note is not None,
        "head_tied_despite_config": head_forced_tied,
        "params_checkpoint_untied_head": params_if_untied,
    }


def compare(count: int, published: int | None, kind: str | None, unit: int | None
            ) -> tuple[str, float | None]:
    """Compare a count with a published figure.

    kind: "exact" (safetensors metadata / paper table), "rounded" (e.g. "7.61B":
    consistent if within one unit of the last published digit, which covers both
    rounding and truncation) or "nominal" (a size in the model name, e.g. "8B":
    consistent within 7.5%).
    """
    if published is None:
        return "n/a", None
    rel = (count - published) / published
    if count == published:
        return "exact", rel
    if kind == "exact":
        return "MISMATCH", rel
    if kind == "rounded" and unit:
        return ("~match" if abs(count - published) < unit else "differs"), rel
    return ("~match" if abs(rel) <= 0.075 else "differs"), rel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, default=INDEX_PATH)
    ap.add_argument("--models-dir", type=Path, default=None,
                    help="directory of the config files (default: the index's directory)")
    ap.add_argument("--only", action="append", default=[], help="hf_id to check (repeatable)")
    ap.add_argument("--update-index", action="store_true",
                    help="write params_transformers/auto_class into index.json")
    ap.add_argument("--json", type=Path, help="write per-model results to this JSON file")
    args = ap.parse_args(argv)

    import torch
    import transformers

    entries = json.loads(args.index.read_text())
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{len(entries)} catalog entries")
    results = []
    failures = 0
    unexplained = 0
    header = f"{'hf_id':55s} {'params_transformers':>20s} {'params_published':>18s} {'rel.diff':>9s}  status"
    print(header)
    print("-" * len(header))
    for entry in entries:
        hf_id = entry["hf_id"]
        if args.only and hf_id not in args.only:
            continue
        raw = json.loads(((args.models_dir or args.index.parent) / entry["file"]).read_text())
        t0 = time.time()
        try:
            res = count_params(raw)
        except Exception as exc:  # report and keep going
            failures += 1
            print(f"{hf_id:55s} {'FAILED':>20s}  {type(exc).__name__}: {exc}")
            results.append({"hf_id": hf_id, "error": f"{type(exc).__name__}: {exc}"})
            continue
        status, rel = compare(
            res["params_transformers"],
            entry.get("params_published"),
            entry.get("params_published_kind"),
            entry.get("params_published_unit"),
        )
        if status in ("MISMATCH", "differs") and res["params_checkpoint_untied_head"]:
            alt, alt_rel = compare(
                res["params_checkpoint_untied_head"],
                entry.get("params_published"),
                entry.get("params_published_kind"),
                entry.get("params_published_unit"),
            )
            if alt not in ("MISMATCH", "differs"):
                status = f"{alt} (with untied lm_head)"
        if status in ("MISMATCH", "differs") and not entry.get("notes"):
            unexplained += 1
        pub = entry.get("params_published")
        print(
            f"{hf_id:55s} {res['params_transformers']:>20,d} {'-' if pub is None else format(pub, ','):>18s} "
            f"{'' if rel is None else format(rel * 100, '+.3f') + '%':>9s}  {status}"
            + ("  [proxy]" if res["proxy"] else "")
            + (f"  [lm_head tied by transformers; checkpoint untied: "
               f"{res['params_checkpoint_untied_head']:,}]" if res["head_tied_despite_config"] else "")
            + f"  ({time.time() - t0:.1f}s)"
        )
        results.append({"hf_id": hf_id, **res, "params_published": pub, "status": status, "rel_diff": rel})
        if args.update_index:
            entry["params_transformers"] = res["params_transformers"]
            entry["auto_class"] = res["auto_class"]
            entry["check_status"] = status
            if res["params_checkpoint_untied_head"]:
                entry["params_checkpoint_untied_head"] = res["params_checkpoint_untied_head"]

    if args.update_index:
        args.index.write_text(json.dumps(entries, indent=2, ensure_ascii=False) + "\n")
        print(f"updated {args.index}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{len(results)} checked, {failures} failed to instantiate, {unexplained} unexplained differences")
    return 1 if failures or unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
