"""Activations saved for backward, per token, from the operations each layer runs.

A small ledger walks one decoder layer the way PyTorch autograd sees it and records what each op keeps
for backward (``torch.autograd`` saves an operand only when the other operand needs a gradient):
- a Linear keeps its input when its weight trains (full / freeze) or a LoRA adapter reads it; modules
  reading the same tensor share one saved copy, unless a dtype cast per module makes a copy each (autocast
  casting an fp32 input, PEFT casting to the fp32 adapter dtype);
- RMSNorm as transformers writes it (``hidden.to(float32)``, ``pow``, ``rsqrt``, ``weight * x``) keeps
  the fp32 input (4h) and, when its weight trains, the normalized output; LayerNorm keeps its input;
- SwiGLU keeps gate-out (SiLU input), SiLU-out and up-out (both mul operands), and the product when
  down_proj needs it; a GELU MLP keeps the fc1 output (and, for transformers' python ``gelu_new``,
  three more intermediates);
- SDPA / flash keep q, k, v, the output and the fp32 log-sum-exp; eager keeps the fp32 softmax output
  and its 16-bit cast (6 bytes per score) instead of O(s) state; transformers' SDPA path repeats
  grouped K/V heads before the kernel (``repeat_kv``) while flash-attention reads them grouped;
- under gradient checkpointing only each layer's input is kept, and one layer is recomputed in backward.

Derivation for a Llama layer, full fine-tune, pure bf16, SDPA with un-repeated K/V: (22h + 4 h_kv + 8f + 4a)
bytes per token (prior-art notes, e.4), which the tests rederive by hand.
"""

from __future__ import annotations

from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.fused_layers import unsloth_fast_lora_layer
from tuneplan.estimator.saved_tensors import (
    DROPOUT_MASK_BYTES,
    LSE_BYTES,
    RSTD_BYTES,
    LayerActs,
    model_dropout,
)
from tuneplan.specs.model import LayerSpec, Linear, ModelSpec
from tuneplan.specs.setup import TrainSetup

SDPA_GQA_MAX_HEAD_DIM = 256  # transformers use_gqa_in_sdpa: key/value head dim <= 256 and no mask
EAGER_SCORE_BYTES = 6  # eager keeps softmax output in fp32 (4) and its 16-bit cast for matmul (2)
# Families whose eager attention computes the softmax in the compute dtype (no fp32 upcast):
# transformers' GPT-2 (`nn.functional.softmax(attn_weights, dim=-1)`) and BERT self-attention.
COMPUTE_DTYPE_SOFTMAX = ("gpt2", "bert", "roberta")


PYTHON_GELU = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh_py")  # transformers NewGELUActivation etc.


class _Ledger:
    """Saved tensors keyed by storage: the same key counts once."""

    def __init__(self) -> None:
        self.items: dict[str, float] = {}

    def save(self, key: str, nbytes: float) -> None:
        self.items[key] = max(self.items.get(key, 0.0), nbytes)

    def total(self) -> float:
        return sum(self.items.values())


class LayerWalk:
    """One layer walked the way autograd sees it: the ledger, the dtypes of the tensors modules read, and
    the two primitives every block is made of, a norm and a linear (with its LoRA adapter).

    The switches are the profile's (``litgpt_code``, ``expand_kv``, ``python_model_code``,
    ``quant_saves_input``) and the layer's place in the model: ``trainable`` (its weights train: full /
    freeze) and ``input_requires_grad`` (false for the first layer LoRA / freeze trains, whose input comes
    from frozen embeddings)."""

    def __init__(self, model: ModelSpec, spec: LayerSpec, setup: TrainSetup, dt: Dtypes, targets: frozenset[str],
                 trainable: bool, python_model_code: bool, quant_saves_input: bool, input_requires_grad: bool,
                 litgpt_code: bool, expand_kv: bool) -> None:
        self.model, self.spec, self.setup, self.dt, self.targets = model, spec, setup, dt, targets
        self.trainable, self.input_requires_grad = trainable, input_requires_grad
        self.python_model_code, self.quant_saves_input = python_model_code, quant_saves_input
        self.litgpt_code, self.expand_kv = litgpt_code, expand_kv
        self.led = _Ledger()
        self.pinned_keys: set[str] = set()
        self.quantized = setup.quant_bits is not None
        self.out_b = dt.quant_out if self.quantized else dt.linear_out
        self.c = dt.compute
        # CUDA autocast runs layer_norm in fp32 (autocast_mode.cpp fp32 list): a 16-bit input is cast to an
        # fp32 copy, which native_layer_norm saves, and the output is fp32 (RMSNorm code upcasts by hand)
        self.ln_fp32 = dt.autocast and model.norm_kind != "rms"
        # bytes per token the first norm keeps that *are* the layer's input (no cast in between): under
        # gradient checkpointing that storage is the checkpoint itself, already counted once
        self.input_alias = 0.0
        # A trained layer of a freeze fine-tune has fp32 norm weights (upcast like every trainable param) on a
        # 16-bit residual stream: ``weight * x.to(input_dtype)`` promotes the norm output to fp32, so each
        # projection reading it under autocast makes its own 16-bit copy (simulate: Qwen2.5-0.5B freeze).
        norm_out_b = dt.trainable if (trainable and setup.method == "freeze") else dt.norm_out
        if self.ln_fp32:
            norm_out_b = 4
        self.inputs_dtype = {"attn_in": norm_out_b, "mlp_in": norm_out_b, "attn_core": self.c,
                             "mlp_mid": self.out_b, "q_latent": self.out_b, "kv_latent": self.out_b}
        self.attn_inputs = {m.name for m in spec.linears if m.role == "attn" and m.reads == "attn_in"}
        # transformers' modeling code applies the config's dropouts; LitGPT's and torchtune's model code has
        # no residual / attention dropout layers (litgpt model.py; torchtune attn_dropout defaults to 0.0)
        self.p_attn, self.p_hidden, _ = (model_dropout(model.config) if not (litgpt_code or expand_kv)
                                         else (0.0, 0.0, 0.0))

    def norm(self, key: str, width: int, grad_in: bool = True) -> None:
        """RMSNorm as transformers writes it keeps its fp32 input (4 x width) and rstd, and its output when
        its weight trains; compiled, the 16-bit input instead of the fp32 upcast; LayerNorm
        (``native_layer_norm``) keeps its input, mean and rstd, never its output."""
        led, dt, model = self.led, self.dt, self.model
        norm_trains = self.trainable
        if not grad_in:
            # The first layer LoRA / freeze trains reads an input that needs no gradient (frozen
            # embeddings below it): autograd keeps nothing for the norm's input path, only what the
            # norm weight's own gradient needs (simulate: layer 0 of a LoRA model saves 16 KiB/token less).
            if norm_trains:
                led.save(key + ".out", dt.norm_out * width)
            return
        if model.norm_kind == "rms" and self.setup.compile:
            # inductor fuses the norm: its 16-bit input and rstd are kept, the fp32 upcast is recomputed
            led.save(key + ".in", dt.residual * width)
            if key == "attn_norm":
                self.input_alias = dt.residual * width
            led.save(key + ".rstd", RSTD_BYTES)
            if norm_trains:
                led.save(key + ".out", dt.norm_out * width)
        elif model.norm_kind == "rms":
            led.save(key + ".fp32_in", 4 * width)
            if key == "attn_norm" and dt.residual == 4:  # ``hidden.to(float32)`` returns the input itself
                self.input_alias = 4 * width
            led.save(key + ".rstd", RSTD_BYTES)
            if norm_trains:
                led.save(key + ".out", dt.norm_out * width)
        else:
            # nn.LayerNorm runs aten.native_layer_norm, whose backward computes the weight and bias
            # gradients from the saved input, mean and rstd: the normalized output is not kept, trained
            # weight or not (simulate: GPT-2 full fine-tune, 2 x 4h per token per layer less).
            led.save(key + ".in", (4 if self.ln_fp32 else dt.residual) * width)
            led.save(key + ".stats", 2 * RSTD_BYTES)
            if key == "attn_norm" and (4 if self.ln_fp32 else dt.residual) == dt.residual:
                self.input_alias = dt.residual * width

    def linear(self, m_name: str, reads: str, d_in: int, tokens_share: float = 1.0) -> None:
        """A Linear keeps its input when its weight trains, or when a LoRA adapter reads it (x d_in bytes of
        the input's dtype, once per storage); its adapter keeps the r-wide middle (lora_A's output) and,
        with dropout, a mask and its own dropped-out input."""
        led, dt, c, targets, trainable = self.led, self.dt, self.c, self.targets, self.trainable
        setup, litgpt_code = self.setup, self.litgpt_code
        in_b = self.inputs_dtype.get(reads, c)
        if litgpt_code and reads == "attn_core" and (trainable or m_name in targets or
                                                       (self.quantized and self.quant_saves_input)):
            # LitGPT: SDPA's output is [B, H, S, D]-contiguous; ``y.transpose(1, 2).reshape(B, T, C)`` copies
            # it, and the projection saves that copy beside the kernel's saved output (litgpt model.py)
            reads = "attn_core_copy"
            self.inputs_dtype[reads] = c
        if (self.quantized and self.quant_saves_input and not trainable
                and (self.input_requires_grad or reads != "attn_in")):
            # Linear4bit casts the input to the compute dtype first: the same storage when it already is.
            # A matmul none of whose inputs needs a gradient (the first LoRA layer's frozen input) records
            # no graph node, so nothing keeps its ctx.tensors
            key = reads if in_b == c else reads + ".q_in"
            led.save(key, c * d_in * tokens_share)
            self.pinned_keys.add(key)
        # one key per module instance: GPT-2 names both its attention and its MLP output projection c_proj
        mk = f"{m_name}@{reads}"
        if trainable:
            if dt.autocast and in_b != c:
                led.save(f"{mk}.cast_in", c * d_in * tokens_share)
            else:
                led.save(reads, in_b * d_in * tokens_share)
        elif setup.zero == 3 and not self.quantized and (self.input_requires_grad or reads != "attn_in"):
            # ZeRO-3 (a model built under zero.Init): F.linear is DeepSpeed's LinearFunctionForZeroStage3
            # (runtime/zero/linear.py, setup_context: ctx.save_for_backward(input, weight, bias)), which
            # keeps a frozen linear's input too whenever the op is recorded (some input requires grad)
            led.save(reads, in_b * d_in * tokens_share)
        if m_name in targets:
            # PEFT casts the adapter input to the adapter dtype; under autocast lora_A then casts it back
            # to 16 bits: a private copy per targeted module. Without a cast the input itself is shared.
            if dt.autocast and (dt.adapter != in_b or in_b != c):
                led.save(f"{mk}.lora_in", c * d_in * tokens_share)
            elif dt.adapter != in_b:
                led.save(f"{mk}.lora_in", dt.adapter * d_in * tokens_share)
            elif (setup.dropout or 0) > 0:
                # lora_A reads dropout(x), a new tensor: a private copy (LitGPT's fused qkv LoRA runs one
                # dropout for q, k and v together: litgpt lora.py LoRAQKVLinear; a checkpoint's fused
                # gate_up_proj is two LoRALinear modules in LitGPT's LLaMAMLP, fc_1 and fc_2, two dropouts)
                copies = 2 if litgpt_code and m_name.endswith("gate_up_proj") else 1
                led.save(f"{self._lora_key(m_name, reads)}.lora_in", copies * in_b * d_in * tokens_share)
            else:
                led.save(reads, in_b * d_in * tokens_share)
            led.save(f"{mk}.lora_mid", (c if dt.autocast else dt.adapter) * setup.rank * tokens_share)
            if (setup.dropout or 0) > 0:
                copies = 2 if litgpt_code and m_name.endswith("gate_up_proj") else 1
                led.save(f"{self._lora_key(m_name, reads)}.dropout_mask", copies * d_in * tokens_share)

    def _lora_key(self, m_name: str, reads: str) -> str:
        return "qkv_fused" if self.litgpt_code and m_name in self.attn_inputs else f"{m_name}@{reads}"


def layer_activations(
    model: ModelSpec, spec: LayerSpec, setup: TrainSetup, dt: Dtypes, targets: frozenset[str],
    trainable: bool, attn: str, python_model_code: bool, quant_saves_input: bool = False,
    input_requires_grad: bool = True, litgpt_code: bool = False, expand_kv: bool = False,
    unsloth_code: bool = False,
) -> LayerActs:
    """What one layer keeps per token: the attention block, the MLP / MoE block, the extra norms, and the
    activation gradients live while it is back-propagated (see the module docstring)."""
    if unsloth_code:
        fast = unsloth_fast_lora_layer(model, spec, setup, dt, targets)
        if fast is not None:
            return fast
    w = LayerWalk(model, spec, setup, dt, targets, trainable, python_model_code, quant_saves_input,
                  input_requires_grad, litgpt_code, expand_kv)
    per_pos, attn = attention_block(w, attn)
    before_mlp = w.led.total()
    mlp_block(w)
    mlp_saved = w.led.total() - before_mlp
    for i in range(max(spec.n_norms - 2, 0)):  # Gemma 2/3, GLM-4: post-attention / post-MLP norms
        w.norm(f"post_norm{i}", model.hidden)
    return _with_backward(w, per_pos, attn, mlp_saved)


def attention_block(w: LayerWalk, attn: str) -> tuple[float, str]:
    """The attention block: its norm, the q/k/v projections (and an MLA latent), the kernel's saved tensors
    (``attention_kernel``), the output projection. Returns the bytes per token per key position (eager
    scores) and the attention implementation that actually runs."""
    model, spec, led, targets = w.model, w.spec, w.led, w.targets
    h = model.hidden
    w.norm("attn_norm", h, w.input_requires_grad)
    for m in spec.linears:
        if m.role == "attn" and m.reads != "attn_core":
            w.linear(m.name, m.reads, m.d_in)
    if w.litgpt_code:
        qkv = [m for m in spec.linears if m.role == "attn" and m.reads == "attn_in"]
        adapted = [m for m in qkv if m.name in targets]
        if adapted and len(adapted) < len(qkv):
            # LoRAQKVLinear.zero_pad scatters the adapted parts' update into a zero qkv-wide tensor with
            # index_copy, whose backward formula (expand_as(source)) keeps the source: the update itself
            led.save("qkv_lora_update", w.c * sum(m.d_out * m.count for m in adapted))
    kv_heads = model.n_kv_heads
    if model.mla_kv_lora_rank:
        led.save("kv_latent_norm", 4 * model.mla_kv_lora_rank)
        kv_heads = model.n_heads  # kv_b_proj expands the latent to every head
    if w.p_hidden > 0:
        # residual dropout after the attention output and after the MLP (GPT-2 resid_pdrop, BERT
        # hidden_dropout_prob): each keeps its one-byte mask; its output only feeds the residual add.
        led.save("attn_out_dropout_mask", DROPOUT_MASK_BYTES * h)
        led.save("mlp_out_dropout_mask", DROPOUT_MASK_BYTES * h)
    if w.litgpt_code and model.config.get("attn_logit_softcapping"):
        attn = "eager"  # litgpt model.py: "with softcapping we cannot use SDPA"
    per_pos = attention_kernel(w, attn, kv_heads)
    for m in spec.linears:
        if m.reads == "attn_core":
            w.linear(m.name, "attn_core", m.d_in)
    return per_pos, attn


def attention_kernel(w: LayerWalk, attn: str, kv_heads: int) -> float:
    """What the attention kernel keeps, a heads x head_dim: SDPA / flash keep q, k, v (c bytes each,
    K/V grouped when the kernel reads them grouped), the output and an fp32 log-sum-exp per head; eager
    keeps q, the repeated k and v, and per key position the softmax output (fp32 or the compute dtype)
    plus its 16-bit cast (or a dropout mask and output). Returns the bytes per token per key position."""
    model, led, c = w.model, w.led, w.c
    a, d, dv = model.n_heads, model.head_dim, model.v_head_dim
    if attn == "sdpa" and c == 4 and kv_heads < a and max(d, dv) <= SDPA_GQA_MAX_HEAD_DIM:
        # fp32 + GQA: transformers passes enable_gqa=True, flash needs 16 bits and the memory-efficient
        # backend has no GQA (sdp_utils.cpp), so SDPA runs its math path: q scaled, K scaled and V
        # repeat_interleave-d, and the fp32 softmax of the B x H x S x S scores saved (simulate).
        led.save("q_attn", c * a * d)
        led.save("k_attn", c * a * d)
        led.save("v_attn", c * a * dv)
        return 4.0 * a
    if attn == "eager":
        return eager_attention(w)
    # fused q/k/v projections whose RoPE replaces q and k but leaves v a view of the fused output: Phi-3's
    # qkv_proj, GPT-NeoX's query_key_value (GPT-2 / BLOOM keep all three as views: the buffer, once)
    fused_qkv = next((m.d_out for m in w.spec.linears if m.name == "qkv_proj"
                      or (m.name == "query_key_value" and model.model_type == "gpt_neox")), 0)
    # transformers sdpa_attention_forward calls repeat_kv only when use_gqa_in_sdpa() is false (a mask
    # is passed, i.e. padded batches, or head_dim > 256); for unpadded causal batches it passes
    # enable_gqa=True and the flash kernel keeps K/V grouped, as flash_attention_2 does (simulate:
    # Qwen2.5-0.5B saved k/v of 256 B/token/layer, not 1792).
    kv_saved = kv_heads if (attn == "flash" or max(d, dv) <= SDPA_GQA_MAX_HEAD_DIM) else a
    if w.litgpt_code:
        # LitGPT repeats grouped K/V heads (repeat_interleave) before SDPA, and its q, k, v come out of
        # one fused qkv Linear: with no repeat (MHA) v stays a view of that whole output (litgpt model.py)
        kv_saved = a
        fused_qkv = (a * d + 2 * kv_heads * d) if kv_heads == a else 0
    elif w.expand_kv:
        # torchtune MultiHeadAttention: "View + expand + reshape bring num_kv_heads to num_heads for k
        # and v" before SDPA (torchtune/modules/attention.py): the kernel saves head-expanded copies
        kv_saved = a
    led.save("q_attn", c * a * d)
    led.save("k_attn", c * kv_saved * d)
    led.save("v_attn", c * kv_saved * dv)
    if fused_qkv and kv_saved == kv_heads:
        # the fused output is sliced into q, k, v views; RoPE replaces q and k, but the kernel saves v,
        # a view that keeps the whole fused buffer alive (simulate: Phi-3-mini +2h, Pythia +4h per token)
        led.save("v_attn", w.out_b * fused_qkv)
    # The kernel writes its output [B, S, H, D]; the module's transpose(1, 2).contiguous() and reshape
    # are views, so the saved output *is* o_proj's input: one storage, keyed like o_proj's read.
    led.save("attn_core", c * a * dv)
    led.save("lse", LSE_BYTES * a)
    return 0.0


def eager_attention(w: LayerWalk) -> float:
    """transformers' eager_attention_forward: repeat_kv, q @ k^T, softmax, (dropout), probs @ v. Per token
    it keeps q (for k's gradient), k and v repeated to every head; per token and key position, per head,
    the softmax output and its 16-bit cast (with dropout: the mask and the dropped-out probabilities)."""
    model, dt, led, c, setup = w.model, w.dt, w.led, w.c, w.setup
    a, d, dv = model.n_heads, model.head_dim, model.v_head_dim
    kv_saved = a  # repeat_kv before the matmuls
    # q @ k^T keeps q only for k's gradient: in the first LoRA layer k needs none unless its
    # projection trains (eager_attention_forward; simulate: Llama-2-7B layer 0 keeps no q).
    k_grad = w.input_requires_grad or w.trainable or any(
        m.name in w.targets and m.name not in ("q_proj", "v_proj", "query", "value")
        for m in w.spec.linears if m.reads == "attn_in")
    if k_grad:
        led.save("q_attn", c * a * d)
    led.save("k_attn", c * kv_saved * d)
    led.save("v_attn", c * kv_saved * dv)
    # Softmax keeps its output (fp32 in eager_attention_forward, the compute dtype in GPT-2/BERT); the
    # probs @ V matmul keeps its 16-bit cast when the dtypes differ. With attention dropout, dropout
    # keeps its mask and the matmul keeps the dropout output instead of the cast.
    # (autocast runs softmax in fp32 whatever the model code asks: it is on autocast's fp32 list)
    soft_b = 4 if (dt.autocast or model.model_type not in COMPUTE_DTYPE_SOFTMAX) else c
    if w.p_attn > 0:
        per_pos = (soft_b + DROPOUT_MASK_BYTES + c) * a
    else:
        per_pos = (soft_b + (c if soft_b != c else 0)) * a
    if model.config.get("attn_logit_softcapping"):
        per_pos += c * a  # tanh(scores / cap) keeps its output for backward (Gemma 2 soft-capping)
    if setup.softmax_keeps_input:
        # torch < 1.11 softmax also kept its input, the masked scores: a decoder's scores are promoted by
        # the causal mask, built in the embeddings' dtype; an encoder's unpadded batch adds no mask
        # (transformers 5 BERT, simulate; 2022's BertModel always added an all-ones mask in the
        # parameters' dtype). CUDA's half-to-float softmax reads 16-bit scores as they are.
        encoder = model.architecture == "encoder"
        per_pos += (dt.linear_out if encoder else max(dt.linear_out, dt.non_block)) * a
    return per_pos


def mlp_block(w: LayerWalk) -> None:
    """The MLP block: its norm (none in a parallel block, which reads the attention's normalized input), the
    router and its fp32 expert probabilities, the routed experts (each token's top-k copies gathered) and
    shared experts, or the dense MLP (``feed_forward``)."""
    model, spec, led, targets = w.model, w.spec, w.led, w.targets
    h = model.hidden
    shared_norm = model.family == "gpt" and spec.n_norms == 1
    mlp = [m for m in spec.linears if m.role in ("mlp", "shared_expert")]
    experts = [m for m in spec.linears if m.role == "expert"]
    routers = [m for m in spec.linears if m.role == "router"]
    # A parallel block (Phi / GPT-J shared norm, GPT-NeoX use_parallel_residual) feeds its MLP from the layer
    # input, not from the attention: in the first layer LoRA trains, whose input needs no gradient, an MLP
    # without adapters is outside the graph and keeps nothing (simulate: Pythia-6.9B layer 0, -12h per token)
    parallel = shared_norm or (model.model_type == "gpt_neox" and bool(model.config.get("use_parallel_residual")))
    if (parallel and not w.input_requires_grad and not w.trainable
            and not any(m.name in targets for m in mlp + experts + routers)):
        mlp, experts, routers = [], [], []
    elif spec.n_norms >= 1 and not shared_norm:
        w.norm("mlp_norm", h)
    # parallel attention + MLP under one norm (Phi, GPT-J, Falcon-7B): the MLP reads the attention's
    # normalized input, the same tensor, so what both save is one storage
    mlp_reads = "attn_in" if shared_norm else "mlp_in"
    for m in routers:
        w.linear(m.name, m.reads, m.d_in)
        led.save(m.name + ".probs_fp32", 4 * m.d_out)  # softmax over experts in fp32
    if experts:
        k = spec.top_k
        # Each routed copy of a token is gathered (index_select) before the expert matmuls.
        if w.trainable or any(m.name in targets for m in experts):
            led.save("expert_gathered", w.c * h * k)
        feed_forward(w, experts, spec.expert_intermediate, float(k), "expert.", mlp_reads)
        led.save("expert_weighted_out", w.out_b * h * k)
        shared = [m for m in mlp if m.role == "shared_expert"]
        feed_forward(w, shared, spec.mlp_intermediate, 1.0, "shared.", mlp_reads)
    else:
        feed_forward(w, mlp, spec.mlp_intermediate or model.intermediate, 1.0, "mlp.", mlp_reads)


def feed_forward(w: LayerWalk, mods: list[Linear], width: int, share: float, prefix: str, mlp_reads: str) -> None:
    """One feed-forward of ``width`` inner features, run on ``share`` copies of each token: SwiGLU keeps
    gate-out, SiLU-out and up-out (3 x width x output bytes; compiled, SiLU is recomputed); a GELU MLP its
    fc1 output, plus three intermediates of a Python GELU (fp32 under autocast: pow upcasts); the down
    projection keeps its input when it trains or is adapted."""
    if not mods:
        return
    model, led, out_b = w.model, w.led, w.out_b
    hidden_act = str(model.config.get("hidden_act", model.config.get("activation_function", "")))
    mid_b = out_b
    for m in mods:
        if m.reads == "mlp_in":
            w.linear(m.name, mlp_reads if share == 1.0 else prefix + "gathered", m.d_in, share)
    if model.mlp_kind == "swiglu":
        led.save(prefix + "gate_out", out_b * width * share)
        if not w.setup.compile:  # compiled, SiLU is recomputed from gate_out in backward
            led.save(prefix + "silu_out", out_b * width * share)
        led.save(prefix + "up_out", out_b * width * share)
    elif w.python_model_code and hidden_act in PYTHON_GELU and w.dt.autocast:
        # 0.5 * x * (1 + tanh(k * (x + 0.044715 * pow(x, 3)))) under CUDA autocast: pow casts x to an fp32
        # copy and keeps it, so everything after it is fp32: tanh's output and (1 + tanh) are kept, and
        # 0.5 * x (16-bit) for the product; x itself is not (transformers NewGELUActivation)
        led.save(prefix + "gelu_parts", (3 * 4 + out_b) * width * share)
        mid_b = 4
    else:
        led.save(prefix + "fc1_out", out_b * width * share)
        if w.python_model_code and hidden_act in PYTHON_GELU:
            led.save(prefix + "gelu_parts", 3 * out_b * width * share)
    for m in mods:
        if m.reads == "mlp_mid":
            key_in = prefix + "mid"
            w.inputs_dtype[key_in] = mid_b
            w.linear(m.name, key_in, m.d_in, share)


def _with_backward(w: LayerWalk, per_pos: float, attn: str, mlp_saved: float) -> LayerActs:
    """The layer's record, with the activation gradients live while it is back-propagated.

    At the MLP's gated product (simulate: Llama-2-7B QLoRA peaks inside the top layer at aten.mul): the
    gradient of down_proj's input and the two products' gradients (gate and up branches), three MLP-wide
    tensors in the MLP's output dtype, next to the incoming residual gradient and its accumulated copy, two
    hidden-wide residual tensors: out_b x 3 x width + residual x 2h per token. The eager score gradients
    (8 bytes per head per key position: the fp32 probabilities' and the scores') come later, in the
    attention's backward, once the MLP block's saved tensors are gone (simulate: BERT-large fp16-mixed, 3
    layers, peaks in the forward)."""
    model, spec, dt = w.model, w.spec, w.dt
    h = model.hidden
    width = max(spec.mlp_intermediate, spec.expert_intermediate * max(spec.top_k, 1), 1)
    bwd = w.out_b * 3 * width + dt.residual * 2 * h
    bwd_pos = (8.0 * model.n_heads) if (attn == "eager" or per_pos) else 0.0  # grad of fp32 probs and of the scores
    return LayerActs(per_token=w.led.total(), per_token_per_pos=per_pos, backward_temp=bwd,
                     backward_temp_per_pos=bwd_pos, pinned=sum(w.led.items[k] for k in w.pinned_keys),
                     attn_backward_offset=dt.residual * 2 * h - mlp_saved, input_alias=w.input_alias)
