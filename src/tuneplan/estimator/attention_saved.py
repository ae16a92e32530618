"""What one layer's attention block saves for backward, per token and per token per key position.

- SDPA / flash keep q, k, v, the output and the fp32 log-sum-exp; eager keeps the fp32 softmax output
  and its 16-bit cast (6 bytes per score) instead of O(s) state; transformers' SDPA path repeats
  grouped K/V heads before the kernel (``repeat_kv``) while flash-attention reads them grouped.
"""

from __future__ import annotations

from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.gemma_norm import norm_output_bytes
from tuneplan.estimator.layer_walk import LayerWalk
from tuneplan.estimator.saved_tensors import DROPOUT_MASK_BYTES, LSE_BYTES
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

SDPA_GQA_MAX_HEAD_DIM = 256  # transformers use_gqa_in_sdpa: key/value head dim <= 256 and no mask
EAGER_SCORE_BYTES = 6  # eager keeps softmax output in fp32 (4) and its 16-bit cast for matmul (2)
# Families whose eager attention computes the softmax in the compute dtype (no fp32 upcast):
# transformers' GPT-2 (`nn.functional.softmax(attn_weights, dim=-1)`) and BERT self-attention.
COMPUTE_DTYPE_SOFTMAX = ("gpt2", "bert", "roberta")


def attention_block(walk: LayerWalk, attn: str) -> tuple[float, str]:
    """The attention block: its norm, the q/k/v projections (and an MLA latent), the kernel's saved tensors
    (``attention_kernel``), the output projection. Returns the bytes per token per key position (eager
    scores) and the attention implementation that actually runs."""
    model, spec, ledger, targets = walk.model, walk.spec, walk.ledger, walk.targets
    hidden = model.hidden
    walk.norm("attn_norm", hidden, walk.input_requires_grad)
    for m in spec.linears:
        if m.role == "attn" and m.reads != "attn_core":
            walk.linear(m.name, m.reads, m.d_in)
    head_norms(walk)
    if walk.litgpt_code:
        adapted = [m for m in spec.qkv if m.name in targets]
        if adapted and len(adapted) < len(spec.qkv):
            # LoRAQKVLinear.zero_pad scatters the adapted parts' update into a zero qkv-wide tensor with
            # index_copy, whose backward formula (expand_as(source)) keeps the source: the update itself
            ledger.save("qkv_lora_update", walk.compute_bytes * sum(m.d_out * m.count for m in adapted))
    kv_heads = model.n_kv_heads
    if model.mla_kv_lora_rank:
        ledger.save("kv_latent_norm", 4 * model.mla_kv_lora_rank)
        kv_heads = model.n_heads  # kv_b_proj expands the latent to every head
    # In the first layer LoRA trains (its input needs no gradient) with no adapter on the attention, no input
    # of the attention's ops requires grad: autograd records neither the kernel nor the output projection nor
    # the residual add, and the MLP's norm reads a stream without gradient (simulate: TinyLlama QLoRA on the
    # MLP, eager, layer 0 keeps no softmax)
    outside = (not walk.input_requires_grad and not walk.trainable
               and not any(m.name in targets for m in spec.linears if m.role == "attn"))
    if outside:
        walk.gradient_free |= {"attn_core", "mlp_in"}
    if walk.hidden_dropout > 0:
        # residual dropout after the attention output and after the MLP (GPT-2 resid_pdrop, BERT
        # hidden_dropout_prob): each keeps its one-byte mask; its output only feeds the residual add.
        if not outside:
            ledger.save("attn_out_dropout_mask", DROPOUT_MASK_BYTES * hidden)
        ledger.save("mlp_out_dropout_mask", DROPOUT_MASK_BYTES * hidden)
    if walk.litgpt_code and model.config.get("attn_logit_softcapping"):
        attn = "eager"  # litgpt model.py: "with softcapping we cannot use SDPA"
    per_pos = 0.0 if outside else attention_kernel(walk, attn, kv_heads)
    before = ledger.total()
    for m in spec.linears:
        if m.reads == "attn_core":
            walk.linear(m.name, "attn_core", m.d_in)
    walk.attn_out_saved = ledger.total() - before
    return per_pos, attn


# transformers' Qwen3Attention (modeling_qwen3.py) and Gemma3Attention (modeling_gemma3.py): ``q_norm`` /
# ``k_norm``, an RMSNorm over each head's head_dim applied to the q / k projections before RoPE
HEAD_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe", "gemma3", "gemma3_text")


def head_norms(walk: LayerWalk) -> None:
    """Qwen3's and Gemma 3's per-head ``q_norm`` / ``k_norm`` (``Qwen3RMSNorm``:
    ``hidden_states.to(torch.float32)``, ``pow`` and the ``rsqrt`` product save the fp32 input,
    ``weight * ...to(input_dtype)`` the output when the weight trains; Gemma's keeps that output in fp32,
    gemma_norm.py), per token: 4 x width + 4 x heads (+ norm_out x width, Gemma's 4 x width), width
    heads x head_dim for q and
    kv_heads x head_dim for k; an input needs a gradient when the layer's input does, when the layer
    trains, or when its projection carries an adapter (simulate: Qwen3-0.6B LoRA on q_proj / v_proj, bf16,
    the fp32 ``_to_copy`` of q and k kept in every layer)."""
    model = walk.model
    if model.model_type not in HEAD_NORM_MODEL_TYPES or walk.litgpt_code:
        return
    for key, proj, heads in (("q_norm", "q_proj", model.n_heads), ("k_norm", "k_proj", model.n_kv_heads)):
        width = heads * model.head_dim
        if walk.input_requires_grad or walk.trainable or proj in walk.targets:
            walk.ledger.save(key + ".fp32_in", 4 * width)
            walk.ledger.save(key + ".rstd", 4 * heads)  # one fp32 rsqrt per head
        if walk.trainable:  # Gemma 3's norm keeps it in fp32 (gemma_norm.py)
            walk.ledger.save(key + ".out", norm_output_bytes(model, walk.dtypes.norm_out) * width)


def attention_kernel(walk: LayerWalk, attn: str, kv_heads: int) -> float:
    """What the attention kernel keeps, a heads x head_dim: SDPA / flash keep q, k, v (compute-dtype bytes
    each, K/V grouped when the kernel reads them grouped), the output and an fp32 log-sum-exp per head; eager
    keeps q, the repeated k and v, and per key position the softmax output (fp32 or the compute dtype)
    plus its 16-bit cast (or a dropout mask and output). Returns the bytes per token per key position."""
    model, ledger, compute_bytes = walk.model, walk.ledger, walk.compute_bytes
    heads, head_dim, v_head_dim = model.n_heads, model.head_dim, model.v_head_dim
    grouped_fits = max(head_dim, v_head_dim) <= SDPA_GQA_MAX_HEAD_DIM
    if attn == "sdpa" and compute_bytes == 4 and kv_heads < heads and grouped_fits:
        # fp32 + GQA: transformers passes enable_gqa=True, flash needs 16 bits and the memory-efficient
        # backend has no GQA (sdp_utils.cpp), so SDPA runs its math path: q scaled, K scaled and V
        # repeat_interleave-d, and the fp32 softmax of the B x H x S x S scores saved (simulate).
        ledger.save("q_attn", compute_bytes * heads * head_dim)
        ledger.save("k_attn", compute_bytes * heads * head_dim)
        ledger.save("v_attn", compute_bytes * heads * v_head_dim)
        return 4.0 * heads
    if attn == "eager":
        return eager_attention(walk)
    # fused q/k/v projections whose RoPE replaces q and k but leaves v a view of the fused output: Phi-3's
    # qkv_proj, GPT-NeoX's query_key_value (GPT-2 / BLOOM keep all three as views: the buffer, once)
    fused_qkv = next((m.d_out for m in walk.spec.linears if m.name == "qkv_proj"
                      or (m.name == "query_key_value" and model.model_type == "gpt_neox")), 0)
    # transformers sdpa_attention_forward calls repeat_kv only when use_gqa_in_sdpa() is false (a mask
    # is passed, i.e. padded batches, or head_dim > 256); for unpadded causal batches it passes
    # enable_gqa=True and the flash kernel keeps K/V grouped, as flash_attention_2 does (simulate:
    # Qwen2.5-0.5B saved k/v of 256 B/token/layer, not 1792).
    kv_saved = kv_heads if (attn == "flash" or grouped_fits) else heads
    if walk.litgpt_code:
        # LitGPT repeats grouped K/V heads (repeat_interleave) before SDPA, and its q, k, v come out of
        # one fused qkv Linear: with no repeat (MHA) v stays a view of that whole output (litgpt model.py)
        kv_saved = heads
        fused_qkv = (heads * head_dim + 2 * kv_heads * head_dim) if kv_heads == heads else 0
    elif walk.expand_kv:
        # torchtune MultiHeadAttention: "View + expand + reshape bring num_kv_heads to num_heads for k
        # and v" before SDPA (torchtune/modules/attention.py): the kernel saves head-expanded copies
        kv_saved = heads
    ledger.save("q_attn", compute_bytes * heads * head_dim)
    ledger.save("k_attn", compute_bytes * kv_saved * head_dim)
    ledger.save("v_attn", compute_bytes * kv_saved * v_head_dim)
    if fused_qkv and kv_saved == kv_heads and walk.out_bytes("attn_in") == compute_bytes:
        # the fused output is sliced into q, k, v views; RoPE replaces q and k, but the kernel saves v,
        # a view that keeps the whole fused buffer alive (simulate: Phi-3-mini +2h, Pythia +4h per token).
        # An output wider than the compute dtype (bitsandbytes casts it back to an fp32 residual's dtype)
        # reaches SDPA through autocast's cast (scaled_dot_product_attention is a lower_precision_fp op):
        # the kernel saves that new copy and the fused buffer is released (simulate: Phi-3-mini QLoRA fp16;
        # Pythia-6.9B QLoRA under autocast, its fp32 LayerNorm output read by the 4-bit query_key_value)
        ledger.save("v_attn", walk.output_bytes * fused_qkv)
    # The kernel writes its output [B, S, H, D]; the module's transpose(1, 2).contiguous() and reshape
    # are views, so the saved output *is* o_proj's input: one storage, keyed like o_proj's read.
    ledger.save("attn_core", compute_bytes * heads * v_head_dim)
    ledger.save("lse", LSE_BYTES * heads)
    return 0.0


# position encodings without RoPE (q and k keep the projection's dtype and storage)
NO_ROPE = ("bloom", "gpt2", "bert", "roberta")


def score_dtypes(model: ModelSpec, setup: TrainSetup, dtypes: Dtypes) -> tuple[int, int, int, bool, int, int]:
    """Bytes per element along eager attention's score chain (eager_forward.py's docstring):
    (attention norm output, projections' outputs, q and k after RoPE, RoPE applied, scores, causal mask);
    the masked scores softmax reads are ``max(scores, mask)``."""
    # the attention norm's output (layer_walk.LayerWalk: autocast runs LayerNorm in fp32; a trained layer
    # of a freeze fine-tune has fp32 norm weights)
    attn_in = dtypes.trainable if setup.method == "freeze" else dtypes.norm_out
    if dtypes.autocast and model.norm_kind != "rms":
        attn_in = 4
    if setup.quant_bits is not None:
        proj = attn_in  # bitsandbytes casts its output back to its input's dtype
    else:
        proj = dtypes.compute if dtypes.autocast else max(dtypes.linear_out,
                                                          dtypes.adapter if setup.is_lora else 0)
    rope = model.model_type not in NO_ROPE and not model.config.get("alibi")
    # RoPE's cos / sin come in the embeddings' dtype (rotary_emb(...).to(x.dtype)) and promote q and k
    q = max(proj, dtypes.non_block) if rope else proj
    scores = dtypes.compute if dtypes.autocast else q
    mask = dtypes.non_block  # the causal mask, in inputs_embeds' dtype (masking_utils, FalconModel)
    return attn_in, proj, q, rope, scores, mask


def half_to_float(model: ModelSpec, setup: TrainSetup, dtypes: Dtypes) -> bool:
    """Whether eager attention's masked scores reach softmax in fp16 (fp16 precisions, scores and causal
    mask both 16-bit: ``score_dtypes``), the input ATen's fused half-to-float softmax takes; an fp32 mask
    (fp32 embeddings) promotes the scores and softmax runs on fp32."""
    _, _, _, _, scores, mask = score_dtypes(model, setup, dtypes)
    return setup.precision.startswith("fp16") and max(scores, mask) == 2


def eager_attention(walk: LayerWalk) -> float:
    """transformers' eager_attention_forward: repeat_kv, q @ k^T, softmax, (dropout), probs @ v. Per token
    it keeps q (for k's gradient), k and v repeated to every head; per token and key position, per head,
    the softmax output and its 16-bit cast (with dropout: the mask and the dropped-out probabilities)."""
    model, dtypes, ledger, setup = walk.model, walk.dtypes, walk.ledger, walk.setup
    compute_bytes = walk.compute_bytes
    heads, head_dim, v_head_dim = model.n_heads, model.head_dim, model.v_head_dim
    kv_saved = heads  # repeat_kv before the matmuls
    # q @ k^T keeps q only for k's gradient: in the first LoRA layer k needs none unless its
    # projection trains (eager_attention_forward; simulate: Llama-2-7B layer 0 keeps no q).
    k_grad = walk.input_requires_grad or walk.trainable or any(
        m.name in walk.targets and m.name not in ("q_proj", "v_proj", "query", "value")
        for m in walk.spec.linears if m.reads == "attn_in")
    if k_grad:
        ledger.save("q_attn", compute_bytes * heads * head_dim)
    ledger.save("k_attn", compute_bytes * kv_saved * head_dim)
    ledger.save("v_attn", compute_bytes * kv_saved * v_head_dim)
    # Softmax keeps its output (fp32 in eager_attention_forward, the compute dtype in GPT-2/BERT); the
    # probs @ V matmul keeps its 16-bit cast when the dtypes differ. With attention dropout, dropout
    # keeps its mask and the matmul keeps the dropout output instead of the cast.
    # (autocast runs softmax in fp32 whatever the model code asks: it is on autocast's fp32 list)
    softmax_bytes = 4 if (dtypes.autocast or model.model_type not in COMPUTE_DTYPE_SOFTMAX) else compute_bytes
    if walk.attention_dropout > 0:
        released = (DROPOUT_MASK_BYTES + compute_bytes) * heads
    else:
        released = (compute_bytes if softmax_bytes != compute_bytes else 0) * heads
    per_pos = softmax_bytes * heads + released
    # the probs @ V matmul's backward releases the tensor it saved (the cast, or dropout's output) and
    # dropout's backward its mask before softmax's backward runs (simulate: Llama-2-70B bf16 eager LoRA, the
    # bf16 probabilities freed before _softmax_backward_data)
    walk.scores_released = released
    # softmax(x, dtype=float32) on an fp16 CUDA input runs the half-to-float kernel (ATen SoftMax.cpp
    # ``softmax``: ``_softmax(input, dim, true)``, no fp32 copy of the scores); its backward,
    # ``_softmax_backward_data(grad, output, dim, input_dtype=Half)``, writes the scores' gradient in fp16.
    # Any other input is converted first (``input_.toType(dtype)``): the gradient comes out in fp32.
    walk.scores_grad_bytes = 2.0 if (softmax_bytes == 4 and half_to_float(model, setup, dtypes)) else 4.0
    if model.config.get("attn_logit_softcapping"):
        # tanh(scores / cap) keeps its output for backward (Gemma 2 soft-capping)
        per_pos += compute_bytes * heads
    if setup.softmax_keeps_input:
        # torch < 1.11 softmax also kept its input, the masked scores: a decoder's scores are promoted by
        # the causal mask, built in the embeddings' dtype; an encoder's unpadded batch adds no mask
        # (transformers 5 BERT, simulate; 2022's BertModel always added an all-ones mask in the
        # parameters' dtype). CUDA's half-to-float softmax reads 16-bit scores as they are.
        encoder = model.architecture == "encoder"
        per_pos += (dtypes.linear_out if encoder else max(dtypes.linear_out, dtypes.non_block)) * heads
    return per_pos
