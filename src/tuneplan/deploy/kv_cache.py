"""KV cache of a served model: bytes per token per layer, by attention kind, and for a whole workload.

- Multi-head / grouped-query attention: each layer caches K and V, ``kv_heads x head_dim`` each, per token
  (``2 x layers x kv_heads x head_dim x tokens x bytes``); GQA/MQA shrink ``kv_heads``.
- Multi-head latent attention (DeepSeek-V2/V3): engines with MLA support (vLLM, SGLang, llama.cpp) cache
  the compressed latent ``kv_lora_rank`` plus the shared rotary key ``qk_rope_head_dim`` once per token and
  layer, with no separate V (DeepSeek-V2 paper, arXiv 2405.04434, section 2.1.2). Engines without it
  (transformers' eager cache) store the expanded K (``heads x (nope + rope)``) and V (``heads x v_head``).
- Sliding-window layers keep at most ``window`` tokens when the engine allocates per layer type (vLLM's
  hybrid KV cache manager, llama.cpp's SWA cache). Which layers slide: ``layer_types`` when the config lists
  it; Gemma 2 every other layer from the first (``Gemma2Config``); Gemma 3 all but every
  ``sliding_window_pattern``-th layer (``Gemma3TextConfig``); Mistral v0.1 all layers when
  ``sliding_window`` is set; Qwen2-style configs only with ``use_sliding_window: true``.
- Tensor parallelism splits KV heads across GPUs; when ``tp`` exceeds the KV heads each GPU still holds
  one head (vLLM replicates them). The MLA latent is not split by heads: every GPU holds all of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.errors import TuneplanError
from tuneplan.specs.model import ModelSpec

KV_DTYPES = {"bf16": 2, "fp16": 2, "fp8": 1}  # vLLM --kv-cache-dtype auto (model dtype) or fp8 (e4m3/e5m2)
MLA_MODES = ("latent", "expanded")


@dataclass(frozen=True)
class KvLayout:
    per_token_full: int  # bytes per token summed over full-attention layers, on one GPU
    per_token_window: int  # bytes per token summed over sliding-window layers, on one GPU
    window: int | None
    full_layers: int
    window_layers: int
    kind: str  # "mha", "gqa", "mqa", "mla-latent", "mla-expanded"

    def bytes_for(self, context: int, sequences: int = 1) -> int:
        """KV bytes on one GPU for ``sequences`` sequences of ``context`` tokens each."""
        win = min(context, self.window) if self.window else context
        return sequences * (self.per_token_full * context + self.per_token_window * win)

    def per_token_at(self, context: int) -> float:
        """Average KV bytes per token of one sequence at this context (what one token of context costs)."""
        return self.bytes_for(context) / context if context else 0.0


def sliding_layers(model: ModelSpec) -> tuple[int, int | None]:
    """(number of sliding-window layers, window) from the config the model was read from."""
    cfg = model.config or {}
    window = cfg.get("sliding_window")
    if not isinstance(window, int) or window <= 0:
        return 0, None
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return sum(1 for t in types if t == "sliding_attention"), window
    mt = model.model_type
    n = model.n_layers
    if mt == "gemma2":
        return sum(1 for i in range(n) if (i + 1) % 2), window
    if mt in ("gemma3_text", "gemma3"):
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return sum(1 for i in range(n) if (i + 1) % pattern), window
    if mt == "mistral" and cfg.get("use_sliding_window", True):
        return n, window
    if cfg.get("use_sliding_window") is True:
        bottom = int(cfg.get("max_window_layers") or n)  # Qwen2: layers from max_window_layers up slide
        return max(n - bottom, 0), window
    return 0, None


def kv_layout(model: ModelSpec, *, dtype_bytes: int = 2, tp: int = 1, mla: str = "latent") -> KvLayout:
    if mla not in MLA_MODES:
        raise TuneplanError(f"unknown value {mla!r}", field="mla_cache", accepted=MLA_MODES)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise TuneplanError(f"must be a positive integer, got {tp!r}", field="tp", accepted="1, 2, 4, 8")
    n = model.n_layers
    if model.mla_kv_lora_rank:
        if mla == "latent":
            rope = int((model.config or {}).get("qk_rope_head_dim", 64))
            per_layer = (model.mla_kv_lora_rank + rope) * dtype_bytes  # replicated on every TP rank
            kind = "mla-latent"
        else:
            heads = -(-model.n_heads // tp)
            per_layer = heads * (model.head_dim + model.v_head_dim) * dtype_bytes
            kind = "mla-expanded"
        return KvLayout(per_layer * n, 0, None, n, 0, kind)
    kv_heads = max(1, -(-model.n_kv_heads // tp))
    per_layer = kv_heads * (model.head_dim + model.head_dim) * dtype_bytes  # K and V
    kind = "mqa" if model.n_kv_heads == 1 else ("gqa" if model.n_kv_heads < model.n_heads else "mha")
    n_win, window = sliding_layers(model)
    return KvLayout(per_layer * (n - n_win), per_layer * n_win, window, n - n_win, n_win, kind)


def kv_dtype_bytes(kv_dtype: str) -> int:
    try:
        return KV_DTYPES[kv_dtype]
    except KeyError:
        raise TuneplanError(f"unknown value {kv_dtype!r}", field="kv_dtype",
                            accepted=tuple(KV_DTYPES)) from None
