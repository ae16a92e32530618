"""Per-family layer layouts: which linears, norms and embeddings transformers builds for a config.

Each builder mirrors the ``__init__`` of the family's modeling file in transformers (module names are
the ones PEFT's ``target_modules`` match). Defaults for keys a config may omit are the defaults of the
family's ``PretrainedConfig`` subclass.
"""

from __future__ import annotations

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


def build_layers(cfg: dict[str, Any], *, name: str, family: str, model_type: str, hidden: int, n_layers: int,
                 n_heads: int, vocab: int, spec_cls: Any, layer_cls: Any, linear_cls: Any) -> Any:
    h = hidden
    kv = int(_g(cfg, "num_key_value_heads", "num_kv_heads", "multi_query_group_num", default=n_heads))
    if model_type == "falcon" and not cfg.get("new_decoder_architecture") and cfg.get("multi_query", True):
        kv = 1  # Falcon-7B: multi-query attention (one shared K/V head)
    head_dim = int(_g(cfg, "head_dim", "kv_channels", default=h // n_heads))
    inter_default = 4 * h
    inter = int(_g(cfg, "intermediate_size", "ffn_hidden_size", "n_inner", "d_ff", default=inter_default))
    tied = _tied(cfg, model_type)
    L = linear_cls
    kw: dict[str, Any] = {}
    other = 0
    mlp_kind, norm_kind = "swiglu", "rms"
    n_experts = top_k = 0
    v_head = head_dim
    kv_lora = 0

    if family in ("llama", "moe"):
        q_out, kv_out = n_heads * head_dim, kv * head_dim
        qkv_bias = bool(cfg.get("attention_bias", model_type in ("qwen2", "qwen2_moe", "glm4", "glm")))
        if model_type in ("qwen2", "qwen2_moe"):
            qkv_bias = True  # Qwen2 always has q/k/v biases (modeling_qwen2: bias=True)
        o_bias = bool(cfg.get("attention_bias", False)) and model_type not in ("qwen2", "qwen2_moe", "glm4", "glm")
        if model_type == "internlm2":
            qkv_bias = o_bias = bool(cfg.get("bias", False))
        mlp_bias = bool(cfg.get("mlp_bias", False))
        if model_type == "phi3":
            attn = (L("qkv_proj", h, q_out + 2 * kv_out, reads="attn_in"),
                    L("o_proj", q_out, h, reads="attn_core"))
        elif model_type == "internlm2":
            attn = (L("wqkv", h, q_out + 2 * kv_out, qkv_bias, reads="attn_in"),
                    L("wo", q_out, h, o_bias, reads="attn_core"))
        else:
            attn = (L("q_proj", h, q_out, qkv_bias, reads="attn_in"),
                    L("k_proj", h, kv_out, qkv_bias, reads="attn_in"),
                    L("v_proj", h, kv_out, qkv_bias, reads="attn_in"),
                    L("o_proj", q_out, h, o_bias, reads="attn_core"))
        norm_w = 1 + (1 if model_type == "stablelm" else 0)  # StableLM uses LayerNorm with bias
        if model_type == "stablelm":
            norm_kind = "layer"
        n_norms = 4 if model_type in ("gemma2", "gemma3_text", "gemma3", "glm4", "glm") else 2
        norm_params = n_norms * h * norm_w
        if model_type in ("qwen3", "qwen3_moe", "gemma3_text", "gemma3", "olmo2"):
            norm_params += 2 * head_dim if model_type != "olmo2" else (q_out + kv_out)

        def dense_mlp(f: int, role: str = "mlp", prefix: str = "") -> tuple[Any, ...]:
            if model_type in ("phi3", "glm4", "glm"):
                return (L(prefix + "gate_up_proj", h, 2 * f, mlp_bias, reads="mlp_in", role=role),
                        L(prefix + "down_proj", f, h, mlp_bias, reads="mlp_mid", role=role))
            if model_type == "internlm2":
                return (L("w1", h, f, reads="mlp_in", role=role), L("w3", h, f, reads="mlp_in", role=role),
                        L("w2", f, h, reads="mlp_mid", role=role))
            if model_type == "mixtral" and role == "expert":
                return (L("w1", h, f, reads="mlp_in", role=role), L("w3", h, f, reads="mlp_in", role=role),
                        L("w2", f, h, reads="mlp_mid", role=role))
            return (L(prefix + "gate_proj", h, f, mlp_bias, reads="mlp_in", role=role),
                    L(prefix + "up_proj", h, f, mlp_bias, reads="mlp_in", role=role),
                    L(prefix + "down_proj", f, h, mlp_bias, reads="mlp_mid", role=role))

        dense = layer_cls(attn + dense_mlp(inter), norm_params, n_norms, mlp_intermediate=inter)
        groups: list[tuple[Any, int]] = [(dense, n_layers)]
        if family == "moe":
            n_experts = int(_g(cfg, "num_local_experts", "num_experts", default=0))
            top_k = int(_g(cfg, "num_experts_per_tok", default=2))
            f_e = int(_g(cfg, "moe_intermediate_size", default=inter))
            if n_experts <= 0:
                raise ConfigError("MoE config needs num_experts > 0", field=f"{name}.num_experts")
            moe_lin = list(attn) + [L("gate", h, n_experts, reads="mlp_in", role="router")]
            moe_lin += [_with_count(m, n_experts) for m in dense_mlp(f_e, role="expert")]
            shared_f = int(_g(cfg, "shared_expert_intermediate_size", default=0))
            if shared_f:
                moe_lin += list(dense_mlp(shared_f, role="shared_expert", prefix="shared_expert."))
                moe_lin.append(L("shared_expert_gate", h, 1, reads="mlp_in", role="router"))
            moe_layer = layer_cls(tuple(moe_lin), norm_params, n_norms, moe=True, top_k=top_k,
                                  expert_intermediate=f_e, mlp_intermediate=shared_f)
            step = int(cfg.get("decoder_sparse_step", 1) or 1)
            dense_only = set(cfg.get("mlp_only_layers", []) or [])
            n_moe = sum(1 for i in range(n_layers) if i not in dense_only and (i + 1) % step == 0)
            groups = [(moe_layer, n_moe)] + ([(dense, n_layers - n_moe)] if n_layers - n_moe else [])
        embed = vocab * h
        lm_head = 0 if tied else vocab * h
        final_norm = h * norm_w

    elif family == "deepseek":
        q_lora = cfg.get("q_lora_rank")
        kv_lora = int(_g(cfg, "kv_lora_rank", default=512))
        nope = int(_g(cfg, "qk_nope_head_dim", default=128))
        rope = int(_g(cfg, "qk_rope_head_dim", default=64))
        v_head = int(_g(cfg, "v_head_dim", default=128))
        head_dim = nope + rope
        kv = n_heads
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
        f_e = int(_g(cfg, "moe_intermediate_size", default=inter))
        n_shared = int(_g(cfg, "n_shared_experts", default=0))
        first_dense = int(_g(cfg, "first_k_dense_replace", default=0))
        freq = int(_g(cfg, "moe_layer_freq", default=1))
        dense = layer_cls(attn + mlp(inter), norm_params, 2, mlp_intermediate=inter)
        moe_lin = list(attn) + [L("gate", h, n_experts, reads="mlp_in", role="router")]
        moe_lin += [_with_count(m, n_experts) for m in mlp(f_e, role="expert")]
        if n_shared:
            moe_lin += list(mlp(f_e * n_shared, role="shared_expert", prefix="shared_experts."))
        moe_layer = layer_cls(tuple(moe_lin), norm_params, 2, moe=True, top_k=top_k,
                              expert_intermediate=f_e, mlp_intermediate=f_e * n_shared)
        n_moe = sum(1 for i in range(n_layers) if n_experts and i >= first_dense and i % freq == 0)
        groups = [(moe_layer, n_moe)] if n_moe else []
        if n_layers - n_moe:
            groups.append((dense, n_layers - n_moe))
        embed, lm_head, final_norm = vocab * h, (0 if tied else vocab * h), h

    elif family == "gpt":
        mlp_kind, norm_kind = "gelu", "layer"
        bias = True
        if model_type == "falcon":
            bias = bool(cfg.get("bias", False))
        q_out, kv_out = n_heads * head_dim, kv * head_dim
        names = {
            "gpt2": ("c_attn", "c_proj", "c_fc", "c_proj"),
            "gpt_neox": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
            "falcon": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
            "bloom": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
            "gpt_bigcode": ("c_attn", "c_proj", "c_fc", "c_proj"),
        }.get(model_type)
        if model_type == "phi":
            attn = (L("q_proj", h, q_out, True, reads="attn_in"), L("k_proj", h, kv_out, True, reads="attn_in"),
                    L("v_proj", h, kv_out, True, reads="attn_in"), L("dense", q_out, h, True, reads="attn_core"))
            mlp_l = (L("fc1", h, inter, True, reads="mlp_in", role="mlp"),
                     L("fc2", inter, h, True, reads="mlp_mid", role="mlp"))
        else:
            qkv_n, o_n, up_n, down_n = names or ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")
            attn = (L(qkv_n, h, q_out + 2 * kv_out, bias, reads="attn_in"), L(o_n, q_out, h, bias, reads="attn_core"))
            mlp_l = (L(up_n, h, inter, bias, reads="mlp_in", role="mlp"),
                     L(down_n, inter, h, bias, reads="mlp_mid", role="mlp"))
        # LayerNorm = weight + bias. Parallel-attention blocks (phi, falcon-7b) have one norm per layer.
        n_norms = 2
        if model_type == "phi" or (model_type == "falcon" and not cfg.get("new_decoder_architecture")):
            n_norms = 1
        norm_params = n_norms * 2 * h
        groups = [(layer_cls(attn + mlp_l, norm_params, n_norms, mlp_intermediate=inter), n_layers)]
        embed = vocab * h
        if model_type in ("gpt2", "gpt_bigcode"):
            embed += int(_g(cfg, "n_positions", "max_position_embeddings", default=1024)) * h
        if model_type == "bloom":
            other = 2 * h  # word_embeddings_layernorm
        lm_head = 0 if tied else vocab * h + (vocab if model_type == "phi" else 0)
        final_norm = 2 * h

    elif family == "chatglm":
        f = int(_g(cfg, "ffn_hidden_size", default=inter))
        q_out, kv_out = n_heads * head_dim, kv * head_dim
        bias = bool(cfg.get("add_qkv_bias", True))
        attn = (L("query_key_value", h, q_out + 2 * kv_out, bias, reads="attn_in"),
                L("dense", q_out, h, bool(cfg.get("add_bias_linear", False)), reads="attn_core"))
        mlp_l = (L("dense_h_to_4h", h, 2 * f, reads="mlp_in", role="mlp"),
                 L("dense_4h_to_h", f, h, reads="mlp_mid", role="mlp"))
        inter = f
        groups = [(layer_cls(attn + mlp_l, 2 * h, 2, mlp_intermediate=f), n_layers)]
        embed, lm_head, final_norm = vocab * h, (0 if tied else vocab * h), h

    elif family == "bert":
        mlp_kind, norm_kind = "gelu", "layer"
        attn = (L("query", h, h, True, reads="attn_in"), L("key", h, h, True, reads="attn_in"),
                L("value", h, h, True, reads="attn_in"), L("dense", h, h, True, reads="attn_core"))
        mlp_l = (L("intermediate.dense", h, inter, True, reads="mlp_in", role="mlp"),
                 L("output.dense", inter, h, True, reads="mlp_mid", role="mlp"))
        groups = [(layer_cls(attn + mlp_l, 4 * h, 2, mlp_intermediate=inter), n_layers)]
        pos = int(_g(cfg, "max_position_embeddings", default=512))
        types = int(_g(cfg, "type_vocab_size", default=2))
        embed = vocab * h + pos * h + types * h + 2 * h
        # BertForMaskedLM head: transform dense (h*h + h) + LayerNorm (2h) + decoder bias (vocab);
        # the decoder weight is tied to the word embeddings.
        other = h * h + h + 2 * h + vocab
        lm_head, final_norm = 0, 0
        tied = True
    else:  # pragma: no cover - family_of only returns the families above
        raise ConfigError(f"no layout for family {family}", field=f"{name}.model_type")

    kw.update(
        name=name, model_type=model_type, family=family, hidden=h, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=kv, head_dim=head_dim, v_head_dim=v_head, vocab=vocab, intermediate=inter,
        tied_embeddings=tied, mlp_kind=mlp_kind, norm_kind=norm_kind, layer_groups=tuple(groups),
        embed_params=embed, lm_head_params=lm_head, final_norm_params=final_norm, other_params=other,
        n_experts=n_experts, top_k=top_k, mla_kv_lora_rank=kv_lora,
        sliding_window=cfg.get("sliding_window") if isinstance(cfg.get("sliding_window"), int) else None,
        max_position=_g(cfg, "max_position_embeddings", "n_positions", "seq_length"),
        torch_dtype=str(_g(cfg, "torch_dtype", "dtype", default="")) or None,
        architecture="encoder" if family == "bert" else "decoder",
        config=cfg,
    )
    return spec_cls(**kw)


def _with_count(m: Any, count: int) -> Any:
    return type(m)(m.name, m.d_in, m.d_out, m.bias, count, m.reads, m.role)
