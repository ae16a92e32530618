"""Per-family layer layouts: which linears, norms and embeddings transformers builds for a config.

Each builder mirrors the ``__init__`` of the family's modeling file in transformers (module names are
the ones PEFT's ``target_modules`` match). Defaults for keys a config may omit are the defaults of the
family's ``PretrainedConfig`` subclass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneplan.errors import ConfigError

# model_type -> family. Families share one builder.
_FAMILY = {
    "llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama", "yi": "llama",
    "gemma": "llama", "gemma2": "llama", "gemma3_text": "llama", "gemma3": "llama", "olmo": "llama",
    "olmo2": "llama", "granite": "llama", "starcoder2": "gpt", "cohere": "llama",
    "glm4": "llama", "glm": "llama", "phi3": "llama", "internlm2": "llama", "internlm": "llama",
    "mixtral": "moe", "qwen2_moe": "moe", "qwen3_moe": "moe", "olmoe": "moe",
    "deepseek_v2": "deepseek", "deepseek_v3": "deepseek",
    "gpt2": "gpt", "gpt_neox": "gpt", "phi": "gpt", "falcon": "gpt", "bloom": "gpt",
    "gpt_bigcode": "gpt", "gptj": "gpt", "opt": "gpt", "stablelm": "llama",
    "chatglm": "chatglm", "bert": "bert", "roberta": "bert",
}

# Defaults of tie_word_embeddings per model_type (each family's PretrainedConfig default).
_TIED_DEFAULT = {
    "gemma": True, "gemma2": True, "gemma3_text": True, "gemma3": True, "gpt2": True, "falcon": True,
    "bloom": True, "bert": True, "roberta": True, "opt": True, "gpt_bigcode": True, "starcoder2": True,
}


def family_of(model_type: str) -> tuple[str, bool]:
    fam = _FAMILY.get(model_type)
    return (fam, True) if fam else ("llama", False)


def _g(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def _tied(cfg: dict[str, Any], model_type: str) -> bool:
    return bool(cfg.get("tie_word_embeddings", _TIED_DEFAULT.get(model_type, False)))


@dataclass(frozen=True)
class Shape:
    """What every family reads from a config before its own layout: sizes, K/V heads, head and MLP widths."""

    cfg: dict[str, Any]
    name: str
    model_type: str
    h: int
    n_layers: int
    n_heads: int
    vocab: int
    kv: int
    head_dim: int
    inter: int
    tied: bool
    linear: Any  # specs.model.Linear
    layer: Any  # specs.model.LayerSpec


def build_layers(cfg: dict[str, Any], *, name: str, family: str, model_type: str, hidden: int, n_layers: int,
                 n_heads: int, vocab: int, spec_cls: Any, layer_cls: Any, linear_cls: Any) -> Any:
    """The ModelSpec of a config: the shared shape, then the family's builder (``_BUILDERS``)."""
    h = hidden
    kv = int(_g(cfg, "num_key_value_heads", "num_kv_heads", "multi_query_group_num", default=n_heads))
    if model_type == "falcon" and not cfg.get("new_decoder_architecture") and cfg.get("multi_query", True):
        kv = 1  # Falcon-7B: multi-query attention (one shared K/V head)
    if model_type == "gpt_bigcode" and cfg.get("multi_query", True):
        kv = 1  # GPTBigCodeAttention: kv_heads = 1 if multi_query (GPTBigCodeConfig default True)
    if model_type in _MHA_ONLY:
        kv = n_heads  # their attention has no K/V head count: a stray num_key_value_heads is not read
    check_heads(cfg, name, model_type, family, h, n_heads, kv)
    head_dim = int(_g(cfg, "head_dim", "kv_channels", default=h // n_heads))
    inter = int(_g(cfg, "intermediate_size", "ffn_hidden_size", "n_inner", "d_ff", default=4 * h))
    shape = Shape(cfg, name, model_type, h, n_layers, n_heads, vocab, kv, head_dim, inter,
                  _tied(cfg, model_type), linear_cls, layer_cls)
    builder = _BUILDERS.get(family)
    if builder is None:  # pragma: no cover - family_of only returns the families below
        raise ConfigError(f"no layout for family {family}", field=f"{name}.model_type")
    lay = {"kv": kv, "head_dim": head_dim, "v_head": head_dim, "inter": inter, "tied": shape.tied,
           "other": 0, "mlp_kind": "swiglu", "norm_kind": "rms", "n_experts": 0, "top_k": 0, "kv_lora": 0,
           **builder(shape)}
    return spec_cls(
        name=name, model_type=model_type, family=family, hidden=h, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=lay["kv"], head_dim=lay["head_dim"], v_head_dim=lay["v_head"], vocab=vocab,
        intermediate=lay["inter"], tied_embeddings=lay["tied"], mlp_kind=lay["mlp_kind"],
        norm_kind=lay["norm_kind"], layer_groups=tuple(lay["groups"]), embed_params=lay["embed"],
        lm_head_params=lay["lm_head"], final_norm_params=lay["final_norm"], other_params=lay["other"],
        n_experts=lay["n_experts"], top_k=lay["top_k"], mla_kv_lora_rank=lay["kv_lora"],
        sliding_window=_window(cfg.get("sliding_window")),
        max_position=_g(cfg, "max_position_embeddings", "n_positions", "seq_length"),
        torch_dtype=str(_g(cfg, "torch_dtype", "dtype", default="")) or None,
        architecture="encoder" if family == "bert" else "decoder",
        config=cfg,
    )


def _window(value: Any) -> int | None:
    """A sliding window in tokens; false, null and 0 (Qwen2MoeConfig's "off") are none."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# model_types whose own code refuses a hidden size that the heads do not divide, whatever head_dim says:
# the config's validate_architecture (LlamaConfig, Gemma2Config, Gemma3TextConfig, GPTNeoXConfig in
# transformers 5) or the attention's __init__ (GPT2Attention, GPTBigCodeAttention, GPTJAttention,
# OPTAttention "embed_dim must be divisible by num_heads", BertSelfAttention / RobertaSelfAttention,
# StableLmAttention, FalconAttention, BloomAttention "hidden_size must be divisible by num_heads").
# Mistral, Qwen2/3, Gemma, Phi... take head_dim = hidden // heads (or the config's head_dim) and build.
HIDDEN_SPLIT_BY_HEADS = frozenset({"llama", "gemma2", "gemma3_text", "gemma3", "gpt_neox", "gpt2",
                                   "gpt_bigcode", "gptj", "opt", "bert", "roberta", "stablelm", "falcon",
                                   "bloom"})
# model_types whose attention projects K and V to every head (no K/V head key in their configs)
_MHA_ONLY = frozenset({"gpt2", "gpt_neox", "opt", "bloom", "gptj", "bert", "roberta"})
# families whose K/V heads are not grouped query heads: DeepSeek's latent attention expands K/V to every
# head (kv = heads by construction); the BERT layout has no K/V head count.
_NO_KV_GROUPS = frozenset({"deepseek", "bert"})


def check_heads(cfg: dict[str, Any], name: str, model_type: str, family: str, h: int, n_heads: int,
                kv: int) -> None:
    """What the architecture's own code requires of the head counts (ConfigError naming the key).

    Grouped-query attention repeats each K/V head ``n_heads // kv`` times (transformers ``repeat_kv``,
    ``num_key_value_groups``; Falcon's fused view ``heads // kv + 2``): more K/V heads than heads, or a
    count that does not divide the heads, gives K/V tensors of another head count than the queries and
    the attention fails. The hidden size must split into whole heads for :data:`HIDDEN_SPLIT_BY_HEADS`."""
    if family not in _NO_KV_GROUPS and kv != n_heads:
        if kv < 1 or kv > n_heads or n_heads % kv:
            divisors = [d for d in range(1, n_heads + 1) if n_heads % d == 0]
            shown = ", ".join(map(str, divisors[:8])) + (", ..." if len(divisors) > 8 else "")
            raise ConfigError(
                f"{kv} key/value heads cannot be shared evenly by {n_heads} attention heads",
                field=f"{name}.{_key(cfg, 'num_key_value_heads', 'num_kv_heads', 'multi_query_group_num')}",
                accepted=f"a divisor of num_attention_heads ({n_heads}): {shown}")
    if model_type in HIDDEN_SPLIT_BY_HEADS and h % n_heads:
        raise ConfigError(f"hidden size {h} does not split into {n_heads} heads ({model_type} requires it)",
                          field=f"{name}.{_key(cfg, 'num_attention_heads', 'n_head')}",
                          accepted=f"a divisor of the hidden size {h}")


def _key(cfg: dict[str, Any], *keys: str) -> str:
    """The spelling of a quantity this config uses (the first of ``keys`` when it gives none)."""
    return next((k for k in keys if cfg.get(k) is not None), keys[0])


def _llama_attention(s: Shape) -> tuple[Any, ...]:
    """q/k/v/o projections (Phi-3: fused qkv_proj; InternLM2: wqkv / wo), q: h -> a x d, k/v: h -> kv x d;
    Qwen2 / GLM-4 carry q/k/v biases."""
    L, h, mt = s.linear, s.h, s.model_type
    q_out, kv_out = s.n_heads * s.head_dim, s.kv * s.head_dim
    qkv_bias = bool(s.cfg.get("attention_bias", mt in ("qwen2", "qwen2_moe", "glm4", "glm")))
    if mt in ("qwen2", "qwen2_moe"):
        qkv_bias = True  # Qwen2 always has q/k/v biases (modeling_qwen2: bias=True)
    o_bias = bool(s.cfg.get("attention_bias", False)) and mt not in ("qwen2", "qwen2_moe", "glm4", "glm")
    if mt == "internlm2":
        qkv_bias = o_bias = bool(s.cfg.get("bias", False))
    if mt == "phi3":
        return (L("qkv_proj", h, q_out + 2 * kv_out, reads="attn_in"),
                L("o_proj", q_out, h, reads="attn_core"))
    if mt == "internlm2":
        return (L("wqkv", h, q_out + 2 * kv_out, qkv_bias, reads="attn_in"),
                L("wo", q_out, h, o_bias, reads="attn_core"))
    return (L("q_proj", h, q_out, qkv_bias, reads="attn_in"),
            L("k_proj", h, kv_out, qkv_bias, reads="attn_in"),
            L("v_proj", h, kv_out, qkv_bias, reads="attn_in"),
            L("o_proj", q_out, h, o_bias, reads="attn_core"))


def _gated_mlp(s: Shape, f: int, role: str = "mlp", prefix: str = "") -> tuple[Any, ...]:
    """A SwiGLU MLP of width f: gate and up h -> f, down f -> h (Phi-3 / GLM-4: fused gate_up_proj h -> 2f;
    InternLM2 and Mixtral's experts: w1 / w3 / w2)."""
    L, h, mt = s.linear, s.h, s.model_type
    mlp_bias = bool(s.cfg.get("mlp_bias", False))
    if mt in ("phi3", "glm4", "glm"):
        return (L(prefix + "gate_up_proj", h, 2 * f, mlp_bias, reads="mlp_in", role=role),
                L(prefix + "down_proj", f, h, mlp_bias, reads="mlp_mid", role=role))
    if mt == "internlm2" or (mt == "mixtral" and role == "expert"):
        return (L("w1", h, f, reads="mlp_in", role=role), L("w3", h, f, reads="mlp_in", role=role),
                L("w2", f, h, reads="mlp_mid", role=role))
    return (L(prefix + "gate_proj", h, f, mlp_bias, reads="mlp_in", role=role),
            L(prefix + "up_proj", h, f, mlp_bias, reads="mlp_in", role=role),
            L(prefix + "down_proj", f, h, mlp_bias, reads="mlp_mid", role=role))


def _llama_norms(s: Shape) -> tuple[int, int, int]:
    """(norms per layer, their parameters, weights per norm): two RMSNorms of h (Gemma 2/3, GLM-4: four);
    StableLM's LayerNorms have a bias too; Qwen3 / Gemma 3 add q/k norms of head_dim, OLMo 2 of q/k width."""
    mt = s.model_type
    norm_w = 1 + (1 if mt == "stablelm" else 0)
    n_norms = 4 if mt in ("gemma2", "gemma3_text", "gemma3", "glm4", "glm") else 2
    norm_params = n_norms * s.h * norm_w
    if mt in ("qwen3", "qwen3_moe", "gemma3_text", "gemma3", "olmo2"):
        norm_params += 2 * s.head_dim if mt != "olmo2" else (s.n_heads * s.head_dim + s.kv * s.head_dim)
    return n_norms, norm_params, norm_w


def _llama(s: Shape) -> dict[str, Any]:
    """Llama-style decoders: attention + gated MLP + two RMSNorms per layer; embeddings vocab x h, an lm_head
    of vocab x h unless tied, a final norm."""
    attn = _llama_attention(s)
    n_norms, norm_params, norm_w = _llama_norms(s)
    dense = s.layer(attn + _gated_mlp(s, s.inter), norm_params, n_norms, mlp_intermediate=s.inter)
    return {"groups": [(dense, s.n_layers)], "norm_kind": "layer" if s.model_type == "stablelm" else "rms",
            "embed": s.vocab * s.h, "lm_head": 0 if s.tied else s.vocab * s.h, "final_norm": s.h * norm_w}


def _moe(s: Shape) -> dict[str, Any]:
    """Llama-style MoE decoders: the router (h -> E), E experts of width f_e (each token routed to top-k),
    an optional shared expert and its gate; dense layers where ``mlp_only_layers`` / ``decoder_sparse_step``
    say so."""
    cfg, L, h = s.cfg, s.linear, s.h
    out = _llama(s)
    n_norms, norm_params, _ = _llama_norms(s)
    n_experts = int(_g(cfg, "num_local_experts", "num_experts", default=0))
    top_k = int(_g(cfg, "num_experts_per_tok", default=2))
    f_e = int(_g(cfg, "moe_intermediate_size", default=s.inter))
    if n_experts <= 0:
        raise ConfigError("MoE config needs num_experts > 0", field=f"{s.name}.num_experts")
    moe_lin = list(_llama_attention(s)) + [L("gate", h, n_experts, reads="mlp_in", role="router")]
    moe_lin += [_with_count(m, n_experts) for m in _gated_mlp(s, f_e, role="expert")]
    shared_f = int(_g(cfg, "shared_expert_intermediate_size", default=0))
    if shared_f:
        moe_lin += list(_gated_mlp(s, shared_f, role="shared_expert", prefix="shared_expert."))
        moe_lin.append(L("shared_expert_gate", h, 1, reads="mlp_in", role="router"))
    moe_layer = s.layer(tuple(moe_lin), norm_params, n_norms, moe=True, top_k=top_k,
                        expert_intermediate=f_e, mlp_intermediate=shared_f)
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    dense_only = set(cfg.get("mlp_only_layers", []) or [])
    n_moe = sum(1 for i in range(s.n_layers) if i not in dense_only and (i + 1) % step == 0)
    dense = out["groups"][0][0]
    out["groups"] = (([(moe_layer, n_moe)] if n_moe else [])
                     + ([(dense, s.n_layers - n_moe)] if s.n_layers - n_moe else []))
    # every layer dense (a step past the layer count, or all in mlp_only_layers): no experts built
    if not n_moe:
        return out
    return {**out, "n_experts": n_experts, "top_k": top_k}


def _deepseek(s: Shape) -> dict[str, Any]:
    """DeepSeek-V2/V3: multi-head latent attention (q through an optional q_lora_rank latent; K/V through a
    kv_lora_rank latent expanded by kv_b_proj to every head; head_dim = nope + rope), and MoE layers from
    ``first_k_dense_replace`` on, every ``moe_layer_freq``, with n_shared shared experts."""
    cfg, L, h, n_heads = s.cfg, s.linear, s.h, s.n_heads
    q_lora = cfg.get("q_lora_rank")
    kv_lora = int(_g(cfg, "kv_lora_rank", default=512))
    nope = int(_g(cfg, "qk_nope_head_dim", default=128))
    rope = int(_g(cfg, "qk_rope_head_dim", default=64))
    v_head = int(_g(cfg, "v_head_dim", default=128))
    head_dim = nope + rope
    bias = bool(cfg.get("attention_bias", False))
    attn_l: list[Any] = []
    norm_params = 2 * h + kv_lora
    if q_lora:
        attn_l += [L("q_a_proj", h, int(q_lora), bias, reads="attn_in"),
                   L("q_b_proj", int(q_lora), n_heads * head_dim, reads="q_latent")]
        norm_params += int(q_lora)
    else:
        attn_l.append(L("q_proj", h, n_heads * head_dim, reads="attn_in"))
    attn_l += [L("kv_a_proj_with_mqa", h, kv_lora + rope, bias, reads="attn_in"),
               L("kv_b_proj", kv_lora, n_heads * (nope + v_head), reads="kv_latent"),
               L("o_proj", n_heads * v_head, h, bias, reads="attn_core")]
    attn = tuple(attn_l)

    def mlp(f: int, role: str = "mlp", prefix: str = "") -> tuple[Any, ...]:
        return (L(prefix + "gate_proj", h, f, reads="mlp_in", role=role),
                L(prefix + "up_proj", h, f, reads="mlp_in", role=role),
                L(prefix + "down_proj", f, h, reads="mlp_mid", role=role))

    n_experts = int(_g(cfg, "n_routed_experts", default=0))
    top_k = int(_g(cfg, "num_experts_per_tok", default=6))
    f_e = int(_g(cfg, "moe_intermediate_size", default=s.inter))
    n_shared = int(_g(cfg, "n_shared_experts", default=0))
    first_dense = int(_g(cfg, "first_k_dense_replace", default=0))
    freq = int(_g(cfg, "moe_layer_freq", default=1))
    dense = s.layer(attn + mlp(s.inter), norm_params, 2, mlp_intermediate=s.inter)
    moe_lin = list(attn) + [L("gate", h, n_experts, reads="mlp_in", role="router")]
    moe_lin += [_with_count(m, n_experts) for m in mlp(f_e, role="expert")]
    if n_shared:
        moe_lin += list(mlp(f_e * n_shared, role="shared_expert", prefix="shared_experts."))
    moe_layer = s.layer(tuple(moe_lin), norm_params, 2, moe=True, top_k=top_k,
                        expert_intermediate=f_e, mlp_intermediate=f_e * n_shared)
    n_moe = sum(1 for i in range(s.n_layers) if n_experts and i >= first_dense and i % freq == 0)
    groups = [(moe_layer, n_moe)] if n_moe else []
    if s.n_layers - n_moe:
        # the groups in layer order where it is one (every layer a MoE from first_k_dense_replace on:
        # transformers DeepseekV2DecoderLayer / DeepseekV3DecoderLayer take the dense MLP for
        # ``layer_idx < first_k_dense_replace``): what counts layers from the top (freeze) reads it
        dense_first = freq == 1 and first_dense > 0
        groups.insert(0 if dense_first else len(groups), (dense, s.n_layers - n_moe))
    return {"groups": groups, "kv": n_heads, "head_dim": head_dim, "v_head": v_head, "kv_lora": kv_lora,
            "n_experts": n_experts, "top_k": top_k,
            "embed": s.vocab * h, "lm_head": 0 if s.tied else s.vocab * h, "final_norm": h}


def _gpt(s: Shape) -> dict[str, Any]:
    """GPT-style blocks: fused qkv (h -> (a + 2 kv) d) and output projections, a GELU MLP h -> f -> h, two
    LayerNorms with bias (one in a parallel block: Phi, Falcon-7B); GPT-2 / BigCode add learned position
    embeddings, BLOOM an embedding LayerNorm, Phi an lm_head bias."""
    cfg, L, h, mt, inter = s.cfg, s.linear, s.h, s.model_type, s.inter
    bias = bool(cfg.get("bias", False)) if mt == "falcon" else True
    q_out, kv_out = s.n_heads * s.head_dim, s.kv * s.head_dim
    names = {
        "gpt2": ("c_attn", "c_proj", "c_fc", "c_proj"),
        "gpt_neox": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
        "falcon": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
        "bloom": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
        "gpt_bigcode": ("c_attn", "c_proj", "c_fc", "c_proj"),
    }.get(mt)
    if mt == "phi":
        attn = (L("q_proj", h, q_out, True, reads="attn_in"), L("k_proj", h, kv_out, True, reads="attn_in"),
                L("v_proj", h, kv_out, True, reads="attn_in"), L("dense", q_out, h, True, reads="attn_core"))
        mlp_l = (L("fc1", h, inter, True, reads="mlp_in", role="mlp"),
                 L("fc2", inter, h, True, reads="mlp_mid", role="mlp"))
    else:
        qkv_n, o_n, up_n, down_n = names or ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")
        attn = (L(qkv_n, h, q_out + 2 * kv_out, bias, reads="attn_in"),
                L(o_n, q_out, h, bias, reads="attn_core"))
        mlp_l = (L(up_n, h, inter, bias, reads="mlp_in", role="mlp"),
                 L(down_n, inter, h, bias, reads="mlp_mid", role="mlp"))
    # LayerNorm = weight + bias. Parallel-attention blocks (phi, falcon-7b) have one norm per layer.
    n_norms = 1 if mt == "phi" or (mt == "falcon" and not cfg.get("new_decoder_architecture")) else 2
    embed = s.vocab * h
    if mt in ("gpt2", "gpt_bigcode"):
        embed += int(_g(cfg, "n_positions", "max_position_embeddings", default=1024)) * h
    return {"groups": [(s.layer(attn + mlp_l, n_norms * 2 * h, n_norms, mlp_intermediate=inter), s.n_layers)],
            "mlp_kind": "gelu", "norm_kind": "layer", "embed": embed,
            "other": 2 * h if mt == "bloom" else 0,  # BLOOM's word_embeddings_layernorm
            "lm_head": 0 if s.tied else s.vocab * h + (s.vocab if mt == "phi" else 0), "final_norm": 2 * h}


def _chatglm(s: Shape) -> dict[str, Any]:
    """ChatGLM: fused query_key_value (h -> (a + 2 kv) d, with bias), dense output, a SwiGLU MLP whose
    dense_h_to_4h is h -> 2f, two RMSNorms."""
    cfg, L, h = s.cfg, s.linear, s.h
    f = int(_g(cfg, "ffn_hidden_size", default=s.inter))
    q_out, kv_out = s.n_heads * s.head_dim, s.kv * s.head_dim
    bias = bool(cfg.get("add_qkv_bias", True))
    attn = (L("query_key_value", h, q_out + 2 * kv_out, bias, reads="attn_in"),
            L("dense", q_out, h, bool(cfg.get("add_bias_linear", False)), reads="attn_core"))
    mlp_l = (L("dense_h_to_4h", h, 2 * f, reads="mlp_in", role="mlp"),
             L("dense_4h_to_h", f, h, reads="mlp_mid", role="mlp"))
    return {"groups": [(s.layer(attn + mlp_l, 2 * h, 2, mlp_intermediate=f), s.n_layers)], "inter": f,
            "embed": s.vocab * h, "lm_head": 0 if s.tied else s.vocab * h, "final_norm": h}


def _bert(s: Shape) -> dict[str, Any]:
    """BERT / RoBERTa encoders: query / key / value / dense h -> h with biases, a GELU MLP, two LayerNorms;
    embeddings for words, positions and token types plus their LayerNorm; the MLM head (transform dense
    h x h + h, LayerNorm 2h, decoder bias vocab) with its decoder weight tied to the word embeddings."""
    cfg, L, h, inter = s.cfg, s.linear, s.h, s.inter
    attn = (L("query", h, h, True, reads="attn_in"), L("key", h, h, True, reads="attn_in"),
            L("value", h, h, True, reads="attn_in"), L("dense", h, h, True, reads="attn_core"))
    mlp_l = (L("intermediate.dense", h, inter, True, reads="mlp_in", role="mlp"),
             L("output.dense", inter, h, True, reads="mlp_mid", role="mlp"))
    pos = int(_g(cfg, "max_position_embeddings", default=512))
    types = int(_g(cfg, "type_vocab_size", default=2))
    return {"groups": [(s.layer(attn + mlp_l, 4 * h, 2, mlp_intermediate=inter), s.n_layers)],
            "mlp_kind": "gelu", "norm_kind": "layer", "embed": s.vocab * h + pos * h + types * h + 2 * h,
            "other": h * h + h + 2 * h + s.vocab, "lm_head": 0, "final_norm": 0, "tied": True}


_BUILDERS = {"llama": _llama, "moe": _moe, "deepseek": _deepseek, "gpt": _gpt, "chatglm": _chatglm,
             "bert": _bert}


def _with_count(m: Any, count: int) -> Any:
    return type(m)(m.name, m.d_in, m.d_out, m.bias, count, m.reads, m.role)
