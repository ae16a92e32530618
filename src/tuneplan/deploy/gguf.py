"""Which GGUF type llama.cpp's quantizer gives each tensor, for the file types tuneplan plans.

The rules follow ``llama_tensor_get_type`` and ``llama_model_quantize_impl`` in llama.cpp
(``src/llama-quant.cpp``) and the F32 list of ``convert_hf_to_gguf.py``:
- quantized: 2-D (and 3-D expert) weights; kept as converted (F32): norms, biases, the MoE router
  (``ffn_gate_inp``), position and token-type embeddings;
- the output matrix (or, when embeddings are tied, ``token_embd``): Q8_0 for Falcon or when its row is not
  a multiple of the file type's block, else Q6_K unless the file type is Q8_0;
- Q4_K_M: ``attn_v`` and ``ffn_down`` get Q6_K in the layers ``use_more_bits`` picks (the first and last
  eighth of the layers and every third layer between), fused ``attn_qkv`` gets Q5_K; 8-expert models
  (Mixtral) get Q8_0 ``attn_v``/``attn_k`` and Q5_K ``attn_output``; 80-layer Llama/Qwen2 ("70B") get
  Q5_K ``attn_v`` where it would be Q4_K;
- a row that is not a multiple of the chosen type's block falls back (Q4_K -> Q5_0, Q5_K -> Q5_1,
  Q6_K -> Q8_0, then F16).
Tensor names are mapped from transformers' module names the way the converter maps them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.deploy.formats import GGUF_BLOCKS, gguf_bytes
from tuneplan.specs.model import Linear, ModelSpec

FTYPE_DEFAULT = {"Q4_K_M": "Q4_K", "Q4_0": "Q4_0", "Q8_0": "Q8_0"}
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}

_ATTN = {"q_proj": "attn_q", "query": "attn_q", "k_proj": "attn_k", "key": "attn_k", "v_proj": "attn_v",
         "value": "attn_v", "o_proj": "attn_output", "dense": "attn_output", "wo": "attn_output",
         "c_proj": "attn_output", "qkv_proj": "attn_qkv", "query_key_value": "attn_qkv", "c_attn": "attn_qkv",
         "wqkv": "attn_qkv", "q_a_proj": "attn_q_a", "q_b_proj": "attn_q_b",
         "kv_a_proj_with_mqa": "attn_kv_a_mqa", "kv_b_proj": "attn_kv_b"}
_FFN = {"gate_proj": "ffn_gate", "w1": "ffn_gate", "up_proj": "ffn_up", "w3": "ffn_up",
        "gate_up_proj": "ffn_up",
        "c_fc": "ffn_up", "fc1": "ffn_up", "dense_h_to_4h": "ffn_up", "intermediate.dense": "ffn_up",
        "down_proj": "ffn_down", "w2": "ffn_down", "c_proj": "ffn_down", "fc2": "ffn_down",
        "dense_4h_to_h": "ffn_down", "output.dense": "ffn_down"}


@dataclass(frozen=True)
class GgufTensor:
    name: str  # GGUF tensor kind, e.g. "attn_v", "ffn_down_exps", "output"
    layer: int  # -1 outside the blocks
    d_in: int
    d_out: int
    count: int  # experts stacked in one 3-D tensor
    gtype: str

    @property
    def nbytes(self) -> int:
        return self.count * gguf_bytes(self.gtype, self.d_in, self.d_out)


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp: the first and last eighth of the layers, and every third layer between (integer
    division)."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def gguf_name(m: Linear) -> str:
    base = m.name.split(".")[-1] if m.role == "shared_expert" else m.name
    if m.role == "router":
        return "ffn_gate_inp"
    kind = _ATTN.get(base, "attn_output") if m.role == "attn" else _FFN.get(base, "ffn_up")
    if m.role == "expert":
        return kind + "_exps"
    if m.role == "shared_expert":
        return kind + "_shexp"
    return kind


def _layer_order(model: ModelSpec) -> list[tuple[int, tuple[Linear, ...]]]:
    """(layer index, linears) in file order; DeepSeek's leading dense layers come first."""
    groups = list(model.layer_groups)
    if model.family == "deepseek":
        groups.sort(key=lambda g: g[0].moe)
    out: list[tuple[int, tuple[Linear, ...]]] = []
    for spec, count in groups:
        for _ in range(count):
            out.append((len(out), spec.linears))
    return out


def _split_internlm(m: Linear, model: ModelSpec) -> list[tuple[str, int, int]]:
    # convert_hf_to_gguf splits InternLM2's fused wqkv into attn_q / attn_k / attn_v
    q, kv = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    return [("attn_q", m.d_in, q), ("attn_k", m.d_in, kv), ("attn_v", m.d_in, kv)]


def tensor_type(name: str, layer: int, d_in: int, ftype: str, model: ModelSpec, wv_index: int,
                wv_total: int, has_output: bool) -> str:
    default = FTYPE_DEFAULT[ftype]
    t = default
    falcon = model.model_type == "falcon"
    experts = model.n_experts
    if name == "output" or (name == "token_embd" and not has_output):
        if falcon or d_in % GGUF_BLOCKS[default][0]:
            t = "Q8_0"
        elif default != "Q8_0":
            t = "Q6_K"
    elif name == "token_embd":
        t = default
    elif name == "attn_v":
        if ftype == "Q4_K_M" and use_more_bits(wv_index, wv_total):
            t = "Q6_K"
        if model.n_layers == 80 and model.model_type in ("llama", "qwen2") and t == "Q4_K":
            t = "Q5_K"  # llama.cpp LLM_TYPE_70B: attn_v is 8x smaller than attn_q under GQA
        if experts == 8:
            t = "Q8_0"
    elif name == "attn_k":
        if experts == 8:
            t = "Q8_0"
    elif name.startswith("ffn_down"):
        if ftype == "Q4_K_M":
            n = model.n_layers
            if falcon:
                t = "Q6_K" if layer < n // 16 else ("Q5_K" if use_more_bits(layer, n) else "Q4_K")
            elif use_more_bits(layer, n):
                t = "Q6_K"
    elif name == "attn_output":
        if not falcon and experts == 8 and ftype == "Q4_K_M":
            t = "Q5_K"
    elif name == "attn_qkv":
        if ftype == "Q4_K_M":
            t = "Q5_K"
    if d_in % GGUF_BLOCKS[t][0]:
        t = FALLBACK.get(t, "F16")
        if d_in % GGUF_BLOCKS[t][0]:
            t = "F16"
    return t


def gguf_tensors(model: ModelSpec, ftype: str) -> tuple[list[GgufTensor], int]:
    """The quantized tensors of ``model`` under ``ftype``, and the F32 bytes of the ones kept as converted."""
    has_output = model.lm_head_params > 0
    order = _layer_order(model)
    raw: list[tuple[str, int, int, int, int]] = []  # name, layer, d_in, d_out, count
    f32 = 0
    for layer, linears in order:
        for m in linears:
            if m.role == "router":
                f32 += 4 * m.params  # ffn_gate_inp stays F32
                continue
            if m.bias:
                f32 += 4 * m.count * m.d_out
            if model.model_type == "internlm2" and m.name == "wqkv":
                raw += [(n, layer, a, b, 1) for n, a, b in _split_internlm(m, model)]
            else:
                raw.append((gguf_name(m), layer, m.d_in, m.d_out, m.count))
    wv_total = sum(1 for r in raw if r[0] in ("attn_v", "attn_qkv", "attn_kv_b"))
    out: list[GgufTensor] = []
    wv = 0
    token = model.vocab * model.hidden
    out.append(GgufTensor("token_embd", -1, model.hidden, model.vocab, 1,
                          tensor_type("token_embd", -1, model.hidden, ftype, model, 0, wv_total, has_output)))
    for name, layer, d_in, d_out, count in raw:
        t = tensor_type(name, layer, d_in, ftype, model, wv, wv_total, has_output)
        if name == "attn_v":
            wv += 1
        out.append(GgufTensor(name, layer, d_in, d_out, count, t))
    if has_output:
        out.append(GgufTensor("output", -1, model.hidden, model.vocab, 1,
                              tensor_type("output", -1, model.hidden, ftype, model, 0, wv_total, has_output)))
        f32 += 4 * (model.lm_head_params - token)  # an output bias (Phi) stays F32
    # Norms, position / token-type embeddings and other small tensors: F32.
    norms = sum(spec.norm_params * n for spec, n in model.layer_groups) + model.final_norm_params
    f32 += 4 * (norms + model.other_params + (model.embed_params - token))
    return out, f32
