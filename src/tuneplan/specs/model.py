"""ModelSpec: what is trained, read from a Hugging Face ``config.json`` dict alone.

The spec lists every parameter group the way transformers instantiates it (module names, shapes,
biases), so that parameter counts are exact and every later formula (quantization, LoRA targets,
activations, FLOPs) reads the same structure. The per-family layouts below mirror the modeling files
of transformers (``modeling_llama.py``, ``modeling_qwen2_moe.py``, ``modeling_deepseek_v3.py``, ...);
the tests check the totals against transformers on the meta device and against published totals.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tuneplan.errors import ConfigError, TuneplanError
from tuneplan.specs.dropouts import model_dropout
from tuneplan.specs.families import build_layers, family_of
from tuneplan.specs.hashed import hash_once
from tuneplan.specs.limits import MAX_MODEL_PARAMS, MODEL_INT_ALIASES, MODEL_INT_RANGES, check_int, show_value


@dataclass(frozen=True)
class Linear:
    """One ``nn.Linear`` (or Conv1D) inside a decoder layer.

    ``count`` is how many copies one layer holds (the number of routed experts for an expert
    projection). ``reads`` names the activation it consumes, so that modules reading the same
    tensor (q/k/v from the attention norm) can share one saved copy in the activation model.
    ``role`` is ``attn``, ``mlp``, ``expert``, ``shared_expert`` or ``router``.
    """

    name: str
    d_in: int
    d_out: int
    bias: bool = False
    count: int = 1
    reads: str = ""
    role: str = "attn"

    @property
    def params(self) -> int:
        return self.count * (self.d_in * self.d_out + (self.d_out if self.bias else 0))


@dataclass(frozen=True)
class LayerSpec:
    """One kind of decoder layer; a model is a sequence of (LayerSpec, how many)."""

    linears: tuple[Linear, ...]
    norm_params: int  # parameters of the norms inside the layer (RMSNorm h, LayerNorm 2h, q/k norms)
    n_norms: int  # how many full-width (hidden) norms run per token, for activations
    moe: bool = False
    top_k: int = 0  # routed experts per token
    expert_intermediate: int = 0
    mlp_intermediate: int = 0  # dense MLP width (or shared-expert width inside a MoE layer)

    @cached_property
    def linear_params(self) -> int:
        return sum(m.params for m in self.linears)

    @cached_property
    def params(self) -> int:
        return self.linear_params + self.norm_params

    # kept on the (frozen) kind of layer: every setup walks the same kinds (estimator/layer_saved.py)
    @cached_property
    def by_name(self) -> dict[str, Linear]:
        """The first linear of each module name, in the layer's order."""
        named: dict[str, Linear] = {}
        for m in self.linears:
            named.setdefault(m.name, m)
        return named

    @cached_property
    def mlp_linears(self) -> tuple[Linear, ...]:
        """The dense MLP's and the shared experts' linears, in the layer's order."""
        return tuple(m for m in self.linears if m.role in ("mlp", "shared_expert"))

    @cached_property
    def expert_linears(self) -> tuple[Linear, ...]:
        return tuple(m for m in self.linears if m.role == "expert")

    @cached_property
    def router_linears(self) -> tuple[Linear, ...]:
        return tuple(m for m in self.linears if m.role == "router")

    @cached_property
    def qkv(self) -> tuple[Linear, ...]:
        """The attention projections reading the attention input (q, k, v, or a fused qkv)."""
        return tuple(m for m in self.linears if m.role == "attn" and m.reads == "attn_in")

    @cached_property
    def qkv_names(self) -> frozenset[str]:
        return frozenset(m.name for m in self.qkv)

    @cached_property
    def qkv_width(self) -> int:
        """Outputs per token of :attr:`qkv`."""
        return sum(m.d_out * m.count for m in self.qkv)

    def active_linear_params(self) -> int:
        """Linear parameters one token multiplies with (top-k of the routed experts)."""
        total = 0
        for m in self.linears:
            if m.role == "expert":
                total += m.params // m.count * self.top_k
            else:
                total += m.params
        return total


@hash_once
@dataclass(frozen=True)
class ModelSpec:
    """A decoder (or encoder) transformer, as far as memory, FLOPs and compatibility care."""

    name: str
    model_type: str
    family: str
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # query/key head dim (nope + rope for MLA)
    v_head_dim: int
    vocab: int
    intermediate: int
    tied_embeddings: bool
    mlp_kind: str  # "swiglu" (gated) or "gelu" (classic two-matrix MLP)
    norm_kind: str  # "rms" or "layer"
    layer_groups: tuple[tuple[LayerSpec, int], ...]
    embed_params: int  # token embeddings (+ position / token-type embeddings)
    lm_head_params: int  # 0 when tied to the embeddings
    final_norm_params: int
    other_params: int = 0  # e.g. BLOOM's embedding LayerNorm, BERT's MLM head transform
    n_experts: int = 0
    top_k: int = 0
    mla_kv_lora_rank: int = 0
    sliding_window: int | None = None
    max_position: int | None = None
    torch_dtype: str | None = None
    architecture: str = "decoder"  # "decoder" or "encoder" (MLM); encoder-decoder is refused
    head_out: int = 0  # outputs of a sequence-classification head in place of the LM head (0: the vocabulary)
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ---- parameter groups -------------------------------------------------------------------
    @cached_property
    def params_layers(self) -> int:
        return sum(spec.params * n for spec, n in self.layer_groups)

    @cached_property
    def params_linear(self) -> int:
        """Parameters of all nn.Linear modules inside the blocks (what bitsandbytes quantizes)."""
        return sum(spec.linear_params * n for spec, n in self.layer_groups)

    @cached_property
    def params_linear_weights(self) -> int:
        """Weights (no biases) of the block linears: the quantized storage."""
        return sum(
            n * sum(m.count * m.d_in * m.d_out for m in spec.linears) for spec, n in self.layer_groups
        )

    @cached_property
    def params_total(self) -> int:
        return (
            self.embed_params
            + self.lm_head_params
            + self.params_layers
            + self.final_norm_params
            + self.other_params
        )

    @cached_property
    def params_active(self) -> int:
        """Parameters a token touches (MoE: top-k experts only), for FLOPs."""
        active = sum(spec.active_linear_params() * n + spec.norm_params * n for spec, n in self.layer_groups)
        return active + self.embed_params + self.lm_head_params + self.final_norm_params + self.other_params

    @property
    def params_non_block(self) -> int:
        """Embeddings, lm_head, final norm: never quantized by bitsandbytes."""
        return self.embed_params + self.lm_head_params + self.final_norm_params + self.other_params

    @property
    def head_width(self) -> int:
        """Outputs per token of the output head: the vocabulary, or a classification head's labels."""
        return self.head_out or self.vocab

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def linear_names(self) -> list[str]:
        """Distinct linear module names inside the blocks (LoRA target vocabulary), in the layers' order."""
        return list(self.linear_roles)

    @cached_property
    def linear_roles(self) -> dict[str, str]:
        """Each distinct linear name's role, in the layers' order; a name both a dense nn.Linear and a MoE
        expert (DeepSeek's dense first layers) keeps the dense role, PEFT's match (specs/lora_targets.py)."""
        roles: dict[str, str] = {}
        for spec, _ in self.layer_groups:
            for m in spec.linears:
                if m.role != "expert" or roles.get(m.name, "expert") == "expert":
                    roles[m.name] = m.role
        return roles

    @cached_property
    def dropouts(self) -> tuple[float, float, float]:
        """:func:`model_dropout` of the config, read once per model (every layer walk of every setup asks)."""
        return model_dropout(self.config)

    @cached_property
    def largest_layer_params(self) -> int:
        return max(spec.params for spec, _ in self.layer_groups)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model_type": self.model_type,
            "family": self.family,
            "hidden": self.hidden,
            "layers": self.n_layers,
            "heads": self.n_heads,
            "kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate": self.intermediate,
            "vocab": self.vocab,
            "tied_embeddings": self.tied_embeddings,
            "experts": self.n_experts,
            "top_k": self.top_k,
            "params_total": self.params_total,
        }


def _get(cfg: dict[str, Any], *keys: str, default: Any = None, required: bool = False, name: str = "") -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    if required:
        raise ConfigError(
            f"config.json has no '{keys[0]}'"
            + (f" (also looked for {', '.join(keys[1:])})" if len(keys) > 1 else ""),
            field=f"{name or 'config'}.{keys[0]}",
        )
    return default


def _positive_int(cfg: dict[str, Any], value: Any, key: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"must be a positive integer, got {show_value(value)}", field=f"{name}.{key}")
    return value


def model_from_config(cfg: dict[str, Any], name: str = "model") -> ModelSpec:
    """Build a ModelSpec from a config.json dict. Raises ConfigError naming a missing/bad field."""
    if not isinstance(cfg, dict):
        raise ConfigError("config.json must be a JSON object", field=name)
    refuse_other_modalities(cfg, name)
    # Wrappers that keep the language model under text_config (and nothing else modelled beside it).
    if "text_config" in cfg and "hidden_size" not in cfg and isinstance(cfg["text_config"], dict):
        text = dict(cfg["text_config"])
        text.setdefault("model_type", str(cfg.get("model_type", "")) + "_text")
        cfg = text
    if not isinstance(cfg.get("model_type") or "", str) or len(cfg.get("model_type") or "") > 64:
        raise ConfigError(f"must be a short string such as \"llama\", "
                          f"got {show_value(cfg.get('model_type'))}",
                          field=f"{name}.model_type", accepted="a transformers model_type, e.g. llama, qwen2")
    model_type = str(cfg.get("model_type") or "")
    if not model_type:
        raise ConfigError("config.json has no 'model_type'", field=f"{name}.model_type")
    if cfg.get("is_encoder_decoder") or model_type in ("t5", "mt5", "bart", "mbart", "umt5", "pegasus"):
        raise ConfigError(
            f"encoder-decoder models ({model_type}) are not supported yet; tuneplan plans decoder-only "
            "and encoder-only fine-tunes",
            field=f"{name}.model_type",
        )
    family, known = family_of(model_type)
    if not known:
        warnings.warn(
            f"model_type '{model_type}' is not a known family; treating it as a Llama-style decoder "
            "(gated MLP, RMSNorm, separate q/k/v): check the parameter count",
            stacklevel=2,
        )
    hidden = _positive_int(
        cfg, _get(cfg, "hidden_size", "n_embd", "d_model", required=True, name=name), "hidden_size", name
    )
    n_layers = _positive_int(
        cfg, _get(cfg, "num_hidden_layers", "n_layer", "num_layers", required=True, name=name),
        "num_hidden_layers", name
    )
    n_heads = _positive_int(
        cfg, _get(cfg, "num_attention_heads", "n_head", required=True, name=name), "num_attention_heads", name
    )
    vocab = _positive_int(
        cfg, _get(cfg, "padded_vocab_size", "vocab_size", required=True, name=name), "vocab_size", name
    )
    check_config_numbers(cfg, name)
    try:
        spec = build_layers(cfg, name=name, family=family, model_type=model_type, hidden=hidden,
                            n_layers=n_layers, n_heads=n_heads, vocab=vocab, spec_cls=ModelSpec,
                            layer_cls=LayerSpec, linear_cls=Linear)
    except ConfigError:
        raise
    except (TypeError, ValueError, KeyError, ArithmeticError) as exc:  # malformed values inside a known field
        raise ConfigError(f"cannot read this config.json: {exc}", field=name) from None
    return _check_built(spec, name)


# Sub-configs and keys of the parts of a multimodal model that are not its language model: the vision
# tower (LLaVA, Gemma 3, Idefics2, Qwen2-VL vision_config; Qwen-VL visual; LLaVA-1.5 mm_vision_tower), an
# audio or speech encoder, BLIP-2's Q-Former, Idefics2's perceiver resampler, Chameleon's VQ image tokenizer.
_MODAL_WORDS = ("vision", "visual", "image", "video", "audio", "speech", "qformer", "perceiver", "vq_")
_MODAL_TOWER_KEYS = ("mm_vision_tower", "vision_tower", "visual", "mm_projector_type")
# sub-configs a language model's own config carries (not a second stack): quantization and RoPE settings
_TEXT_SIDE_CONFIGS = frozenset({"quantization_config", "rope_config", "compression_config"})


def refuse_other_modalities(cfg: dict[str, Any], name: str) -> None:
    """A multimodal config is refused, never counted as its language model alone.

    The layouts model decoder and encoder language models; a vision tower, projector or audio encoder
    is a stack of its own (BLIP-2's is 90 % of the model, Idefics2's 8.7 %, LLaVA's 2.8 %). A sub-config
    of another modality (a dict under a key naming it), a tower key, or beside a text_config any other
    sub-config (a speech encoder, a detection backbone, a projector) refuses the config, naming the key."""
    for key, value in cfg.items():
        if not isinstance(key, str) or key == "text_config":
            continue
        modal = (isinstance(value, dict) and any(w in key.lower() for w in _MODAL_WORDS)) \
            or (key in _MODAL_TOWER_KEYS and value not in (None, "", False))
        # beside a text_config, any other sub-config is a second stack (a speech encoder, a detection
        # backbone)
        composite = "text_config" in cfg and isinstance(value, dict) and key.endswith("_config") \
            and key not in _TEXT_SIDE_CONFIGS
        if not (modal or composite):
            continue
        vision = any(w in key.lower() for w in ("vision", "visual", "image", "video"))
        part = "the vision part" if vision else f"the {key.removesuffix('_config')} part"
        raise ConfigError(
            f"a multimodal model ({cfg.get('model_type') or 'unknown type'}): {part} not modelled "
            f"('{key}'); tuneplan counts language models only, and a partial count would understate the "
            "memory", field=f"{name}.{key}",
            accepted="a language model's config.json "
                     "(for the language part alone: its text_config as a file)")


def check_config_numbers(cfg: dict[str, Any], name: str) -> None:
    """Every size a config.json gives, checked for type, sign and a sane range before any formula runs.

    The ranges and why each is sane are in :mod:`tuneplan.specs.limits`; a key given under another
    spelling (``n_embd``, ``n_routed_experts``...) is held to the range of the quantity it names.
    """
    for key, value in cfg.items():
        canon = MODEL_INT_ALIASES.get(key, key)
        if canon not in MODEL_INT_RANGES or value is None:
            continue
        if canon in ("sliding_window", "q_lora_rank") and value is False:
            continue  # "no sliding window" / "no q compression" written as false
        if canon == "sliding_window" and value == 0 and not isinstance(value, bool):
            continue  # "no sliding window": Qwen2MoeConfig writes 0 when use_sliding_window is off
        low, high, why = MODEL_INT_RANGES[canon]
        try:
            check_int(f"{name}.{key}", value, low, high, why)
        except TuneplanError as exc:
            raise ConfigError(exc.message, field=exc.field, accepted=exc.accepted) from None
    only = cfg.get("mlp_only_layers")
    if only is not None and (not isinstance(only, list)
                             or len(only) > MODEL_INT_RANGES["num_hidden_layers"][1]
                             or not all(isinstance(i, int) and not isinstance(i, bool) for i in only)):
        raise ConfigError("must be a list of layer indices", field=f"{name}.mlp_only_layers",
                          accepted="e.g. [] or [0, 1]")
    experts = next((cfg[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if cfg.get(k)),
                   0)
    top_k = cfg.get("num_experts_per_tok")
    if experts and isinstance(top_k, int) and top_k > experts:
        raise ConfigError(f"routes each token to {top_k} experts but has {experts}",
                          field=f"{name}.num_experts_per_tok", accepted=f"1..{experts}")


def _check_built(spec: ModelSpec, name: str) -> ModelSpec:
    """What the per-field ranges cannot see: a head width of 0 and a product beyond any model."""
    if spec.head_dim < 1 or spec.n_kv_heads < 1:
        raise ConfigError(f"gives attention heads of width {spec.head_dim} (hidden {spec.hidden} / "
                          f"{spec.n_heads} heads)", field=f"{name}.num_attention_heads",
                          accepted="at most hidden_size heads, or an explicit head_dim >= 1")
    # the family's default top-k included (MixtralConfig: 2)
    if spec.n_experts and spec.top_k > spec.n_experts:
        raise ConfigError(f"routes each token to {spec.top_k} experts but has {spec.n_experts} "
                          "(torch.topk over the router's outputs needs k at most the experts)",
                          field=f"{name}.num_experts_per_tok", accepted=f"1..{spec.n_experts}")
    if spec.params_total > MAX_MODEL_PARAMS:
        raise ConfigError(f"describes {spec.params_total:.3g} parameters, beyond any model",
                          field=name, accepted=f"at most {MAX_MODEL_PARAMS:.0e} parameters")
    return spec
