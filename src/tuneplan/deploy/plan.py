"""``plan_deploy``: the last leg of the plan: merge the adapter, store the model, serve it, how fast.

Pure composition of the deploy formulas over the same ModelSpec and TrainSetup the training estimate uses;
returns one JSON-ready dict that the CLI, the web page and the API show as they are.
"""

from __future__ import annotations

from typing import Any

from tuneplan.deploy.decode import crossover_batch, decode_bound, decode_inputs
from tuneplan.deploy.formats import ServeFormat, resolve_format
from tuneplan.deploy.kv_cache import KvLayout, kv_dtype_bytes, kv_layout
from tuneplan.deploy.merge import merge_plan
from tuneplan.deploy.serving import ACTIVATION_BAND, CUDA_GRAPHS_BAND, overheads
from tuneplan.deploy.weights import serving_weights
from tuneplan.errors import TuneplanError
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

DEFAULT_GPU_UTIL = 0.9  # vLLM gpu_memory_utilization default: the engine's share of the card
ADAPTER_SERVE_BYTES = 2  # an unmerged adapter is served in the model's 16-bit dtype (vLLM LoRA slots)
MAX_CONTEXT_SEARCH = 1 << 24


def _positive(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise TuneplanError(f"must be a positive integer, got {v!r}", field=name, accepted="1, 2, 3, ...")
    return v


def max_concurrency(free: int, kv: KvLayout, context: int) -> int:
    per_seq = kv.bytes_for(context)
    return max(free // per_seq, 0) if per_seq else 0


def max_context(free: int, kv: KvLayout, limit: int) -> int:
    """Longest single-sequence context whose KV cache fits ``free`` bytes (at most ``limit``)."""
    if free <= 0:
        return 0
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if kv.bytes_for(mid) <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_deploy(model: str | ModelSpec, setup: TrainSetup | None = None, *, serve_precision: str = "bf16",
                quant_method: str | None = None, context: int = 4096, concurrency: int = 1,
                gpu: str | Accelerator | None = None, tp: int = 1, kv_dtype: str | None = None,
                keep_adapter: bool = False, mla_cache: str = "latent", prefill_tokens: int = 2048,
                gpu_util: float = DEFAULT_GPU_UTIL, cuda_graphs: bool = True, qlora_merge: str = "dequantize",
                cards: bool = True, **setup_fields: Any) -> dict[str, Any]:
    """Memory to serve the fine-tuned model per GPU, the merge step, disk sizes and a decode-speed bound."""
    from tuneplan.api import build_setup
    from tuneplan.catalog.accelerators import accelerators, resolve_accelerator
    from tuneplan.catalog.models import resolve_model
    from tuneplan.specs.limits import DEPLOY_INT_RANGES, check_int

    spec = resolve_model(model) if isinstance(model, str) else model
    s = build_setup(spec, setup, **setup_fields)
    for name, v in (("context", context), ("concurrency", concurrency), ("tp", tp),
                    ("prefill_tokens", prefill_tokens)):
        _positive(name, v)
        check_int(name, v, *DEPLOY_INT_RANGES[name])  # bounded: a 80-digit context overflows float math
    if not 0.05 <= float(gpu_util) <= 1.0:
        raise TuneplanError(f"got {gpu_util}", field="gpu_util", accepted="0.05 .. 1.0")
    if qlora_merge not in ("dequantize", "reload"):
        raise TuneplanError(f"unknown value {qlora_merge!r}", field="qlora_merge",
                            accepted="dequantize, reload")
    fmt = resolve_format(serve_precision, quant_method)
    kvd = kv_dtype or ("bf16" if serve_precision == "bf16" else "fp16")
    kv = kv_layout(spec, dtype_bytes=kv_dtype_bytes(kvd), tp=tp, mla=mla_cache)
    w = serving_weights(spec, fmt)
    mp = merge_plan(spec, s, qlora_path=qlora_merge)
    unmerged = keep_adapter and s.is_lora
    adapter = -(-mp.adapter_params * ADAPTER_SERVE_BYTES // tp) if unmerged else 0
    ov = overheads(spec, tp=tp, prefill_tokens=prefill_tokens, concurrency=concurrency,
                   cuda_graphs=cuda_graphs)
    weights_gpu = w.per_gpu(tp)
    kv_total = kv.bytes_for(context, concurrency)
    fixed = weights_gpu + adapter + ov.activations + ov.workspace
    total = fixed + kv_total
    limit = int(spec.max_position or MAX_CONTEXT_SEARCH)

    out: dict[str, Any] = {
        "model": spec.summary(),
        "training": {"method": s.method, "bits": s.quant_bits, "rank": s.rank if s.is_lora else None,
                     "targets": s.targets if s.is_lora else None, "framework": s.framework},
        "serving": {"precision": serve_precision, "quant_method": fmt.key, "format": fmt.label,
                    "context": context, "concurrency": concurrency, "tp": tp, "kv_dtype": kvd,
                    "adapter": "kept separate (unmerged)" if unmerged else (
                        "merged into the base" if s.is_lora else "none (full weights trained)"),
                    "prefill_tokens": prefill_tokens, "gpu_util": gpu_util, "cuda_graphs": cuda_graphs},
        "per_gpu": {"weights": weights_gpu, "adapter": adapter, "kv_cache": kv_total,
                    "activations": ov.activations, "workspace": ov.workspace, "total": total},
        "weights": {"total_bytes": w.total, "quantized_bytes": w.quantized,
                    "unquantized_bytes": w.unquantized,
                    "bits_per_param": 8 * w.total / spec.params_total, "gguf_types": dict(w.gguf_types),
                    "unquantized": _unquantized_text(fmt.family)},
        "kv_cache": {"kind": kv.kind, "bytes_per_token": kv.per_token_at(context),
                     "bytes_per_sequence": kv.bytes_for(context), "full_layers": kv.full_layers,
                     "window_layers": kv.window_layers, "window": kv.window, "dtype": kvd,
                     "mla_cache": mla_cache if spec.mla_kv_lora_rank else None},
        "workspace": {"cuda_context": ov.cuda_context, "cublas": ov.cublas, "cuda_graphs": ov.cuda_graphs,
                      "activation_per_token": ov.activation_per_token, "sampler": ov.sampler},
        "bands": {"activations": [int(ov.activations * ACTIVATION_BAND[0]),
                                  int(ov.activations * ACTIVATION_BAND[1])],
                  "cuda_graphs": list(CUDA_GRAPHS_BAND) if cuda_graphs else [0, 0]},
        "merge": mp.to_dict(),
        "disk": _disk(spec, w.total, mp),
        "context_limit": limit,
        "assumptions": _assumptions(fmt.family, spec, unmerged),
    }
    acc = resolve_accelerator(gpu) if isinstance(gpu, str) else gpu
    if acc is not None:
        budget = int(acc.memory_bytes * gpu_util)
        runs, why = runs_on(acc, fmt)
        out["gpu"] = {"id": acc.id, "name": acc.name, "memory_bytes": acc.memory_bytes,
                      "budget_bytes": budget,
                      "fits": total <= budget and runs, "memory_fits": total <= budget, "runs": runs,
                      "runs_note": why, "headroom_bytes": budget - total,
                      "max_concurrency_at_context": max_concurrency(budget - fixed, kv, context),
                      "max_context_one_sequence": max_context(budget - fixed, kv, limit),
                      "merge_fits": mp.peak_bytes + ov.cuda_context <= acc.memory_bytes}
        d = decode_inputs(spec, s, w, kv, context=context, tp=tp, adapter_bytes=adapter, unmerged=unmerged)
        cross = crossover_batch(d, acc)
        out["decode"] = {"single": decode_bound(d, acc, 1),
                         "at_concurrency": decode_bound(d, acc, concurrency),
                         "compute_bound_from_batch": cross,
                         "crossover_fits_memory": cross is not None and cross
                         <= out["gpu"]["max_concurrency_at_context"],
                         "adapter_flops_share": d.adapter_flops / d.flops_per_token if d.flops_per_token
                         else 0.0,
                         "is_bound": True}
    if cards:
        out["cards"] = _cards(accelerators(), fmt, fixed, kv, context, concurrency, gpu_util, tp, limit)
    return out


def runs_on(acc: Accelerator, fmt: ServeFormat) -> tuple[bool, str]:
    """Whether the format's usual engine runs on this card (NVIDIA compute capability; others unchecked)."""
    cc = acc.compute_capability
    if cc is None:
        return True, "compute capability unknown (non-NVIDIA): kernel support not checked"
    if tuple(cc) < fmt.min_cc:
        need = ".".join(map(str, fmt.min_cc))
        return False, f"{fmt.label} needs compute capability {need}, this card has {cc[0]}.{cc[1]}"
    return True, ""


def _cards(cat: dict[str, Accelerator], fmt: ServeFormat, fixed: int, kv: KvLayout, context: int,
           concurrency: int, gpu_util: float, tp: int, limit: int) -> list[dict[str, Any]]:
    rows = []
    need = fixed + kv.bytes_for(context, concurrency)
    for acc in cat.values():
        if not acc.memory_bytes:
            continue
        budget = int(acc.memory_bytes * gpu_util)
        runs, why = runs_on(acc, fmt)
        rows.append({"id": acc.id, "name": acc.name, "memory_bytes": acc.memory_bytes, "tp": tp,
                     "fits": need <= budget and runs, "memory_fits": need <= budget, "runs_note": why,
                     "max_concurrency_at_context": max_concurrency(budget - fixed, kv, context),
                     "max_context_one_sequence": max_context(budget - fixed, kv, limit),
                     "memory_bandwidth_gbs": acc.memory_bandwidth_gbs})
    rows.sort(key=lambda r: (not r["fits"], r["memory_bytes"]))
    return rows


def _disk(spec: ModelSpec, served: int, mp: Any) -> dict[str, Any]:
    return {"training_checkpoint_bytes": mp.checkpoint_bytes,
            "training_checkpoint": "adapter only" if mp.needed else "full model",
            "merged_16bit_bytes": 2 * spec.params_total, "served_format_bytes": served,
            "note": "safetensors/GGUF add a header and (GGUF) the tokenizer: a few MiB"}


def _unquantized_text(family: str) -> str:
    return {
        "16bit": "everything at 16 bits",
        "bnb": "embeddings and lm_head at 16 bits; every linear inside the blocks quantized",
        "gptq": "embeddings, lm_head, norms, biases, MoE router at 16 bits",
        "awq": "embeddings, lm_head, norms, biases, MoE router at 16 bits",
        "gguf": "norms, biases, MoE router in F32; embeddings and output quantized (output Q6_K/Q8_0)",
    }[family]


def _assumptions(family: str, spec: ModelSpec, unmerged: bool) -> list[str]:
    a = ["budget = usable memory x gpu_util (vLLM pre-allocates that share and fills what is left with KV "
         "cache)",
         "activations: one prefill step of prefill_tokens tokens, one layer live at a time (a floor)",
         "decode speed is an upper bound from memory bandwidth and dense 16-bit throughput"]
    if spec.mla_kv_lora_rank:
        a.append("MLA: the latent KV cache is replicated on every tensor-parallel GPU")
    if spec.is_moe:
        a.append("MoE decode reads the experts the batch's tokens visit, routing assumed uniform")
    if unmerged:
        a.append("unmerged adapter: its matmuls run beside every targeted layer on every token; merging "
                 "removes "
                 "that cost")
    if family == "gguf":
        a.append("GGUF type mix as llama-quantize picks it without an importance matrix")
    return a
