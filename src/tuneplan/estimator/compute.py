"""The work of one training token, from the architecture: matmul FLOPs and bytes moved.

FLOPs (one multiply-add = 2 FLOPs), per token, at sequence length ``s``:
- every ``nn.Linear`` in the blocks: ``2 * d_in * d_out`` forward; MoE experts count the ``top_k`` routed
  copies a token visits, not all experts; the router and shared experts are dense;
- attention core: ``QK^T`` ``2 * heads * head_dim * ctx`` and ``PV`` ``2 * heads * v_head_dim * ctx``, where
  ``ctx`` is the number of key positions a query meets: ``s`` for eager attention (it computes the whole
  ``s x s`` score matrix, then masks it) and for encoders, ``(s + 1) / 2`` for causal SDPA/flash kernels
  that skip the masked blocks (FlashAttention-2, Dao 2023, section 3.1 "causal masking");
- logits: ``2 * hidden * vocab`` (the lm_head is a matmul even when tied);
- backward: input gradients ``1x`` the forward of every linear the gradient flows through, weight gradients
  another ``1x`` only for weights that train (full / freeze layers; LoRA adapters), so LoRA and QLoRA are
  about 4N instead of 6N; attention core ``2x`` forward for eager, ``2.5x`` for SDPA/flash, whose backward
  recomputes ``QK^T`` (five matmuls against two forward: FlashAttention-2 paper, algorithm 2);
- LoRA adapters: ``2 * r * (d_in + d_out)`` forward per targeted module and ``2x`` that backward; a
  LoRA'd fused expert stack instead makes grouped_mm's weight gradient, ``2 * top_k * d_in * d_out``;
- gradient checkpointing (one checkpoint per decoder layer, as transformers / torchtune / litgpt do):
  the layers' forward once more during backward; the lm_head and loss are not checkpointed;
- ``method=freeze``: only the top ``freeze_trainable_layers`` layers run a backward at all.
The reference ``6 N`` (Kaplan et al. 2020; EleutherAI "Transformer Math 101") is reported beside the count.

QLoRA dequantization is not tensor-core work: bitsandbytes rebuilds a 16-bit copy of each 4-bit weight
before every matmul that uses it (``MatMul4Bit``: forward, the input-gradient matmul, and the recompute).
Its cost is memory traffic per micro-batch, counted here as elements and timed in ``throughput``.

Bytes moved by the element-wise kernels (norms, rotary, activations, residual adds, softmax of eager
attention, LoRA's dropout/scale/add, the loss chain) are counted per token from the same structure: each
tensor a layer produces is written once and read once in forward; backward moves about twice that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from tuneplan.estimator.bnb_scope import quantized, quantized_weights
from tuneplan.estimator.dtypes import Dtypes, resolve_dtypes
from tuneplan.estimator.fused_expert_lora import expert_stacks
from tuneplan.estimator.weights import lora_targets
from tuneplan.specs.model import LayerSpec, Linear, ModelSpec
from tuneplan.specs.profiles import get_profile, loss_kind
from tuneplan.specs.setup import TrainSetup

# Attention backward / forward matmul ratio. Eager: dS and dP give dQ, dK, dV, dP (4 matmuls vs 2).
# SDPA/flash: 5 matmuls (S = QK^T is recomputed) vs 2 (FlashAttention-2, Dao 2023, algorithm 2).
ATTN_BWD_EAGER = 2.0
ATTN_BWD_FLASH = 2.5

# Element-wise bytes produced per element, unfused PyTorch (per op output):
# HF/litgpt/torchtune RMSNorm upcast to fp32, square, mean-scale (3 fp32 tensors), then cast back and
# multiply by the weight (2 compute-dtype tensors): transformers LlamaRMSNorm.forward.
NORM_FP32_TENSORS = 3
NORM_HALF_TENSORS = 2
# Rotary embedding: rotate_half (slice + cat), x*cos, rotate*sin, add: 4 outputs the size of q and k.
ROTARY_TENSORS = 4
# Loss chain bytes per logit (ForCausalLMLoss: 16-bit logits 2, fp32 upcast 4, log-softmax 4, gradient 4;
# the memory model uses the same 14 B, see logits.py). Chunked losses still materialize every chunk
# (torchtune fp32 chunks, litgpt bf16 chunks); a fused kernel (Unsloth, Liger) writes roughly the logits once.
LOSS_BYTES_PER_LOGIT = {"hf": 14.0, "chunked_fp32": 10.0, "chunked_bf16": 8.0, "fabric_chunked": 10.0,
                        "torchtune_legacy": 14.0, "chunked_compiled": 6.0, "fused": 2.0,
                        "fused_linear": 0.0}
# Forward traffic = write + read of every produced tensor; backward moves about twice the forward
# (reads the saved input, writes and reads the gradient of each tensor).
FWD_TRAFFIC_PER_BYTE = 2.0
BWD_TRAFFIC_PER_FWD = 2.0
# Kernels: backward launches about 1.5x the forward's (two matmuls per trained linear, one per frozen
# one; most element-wise ops have one backward kernel, views none): a count, not a measurement.
BWD_KERNELS_PER_FWD = 1.5


def _adapter_backward_bytes(d_in: int, d_out: int, dropout: bool, elem: int) -> float:
    """Bytes one LoRA adapter's backward produces per token, op by op (PEFT ``Linear.forward``:
    ``result + lora_B(lora_A(dropout(x))) * scaling``): the add passes its gradient through (no kernel); the
    scaling multiply writes one ``d_out`` gradient; ``lora_A``'s input gradient is a ``d_in`` matmul
    output; dropout's backward writes one ``d_in`` gradient; autograd adds the adapter's input gradient to
    the base layer's (``d_in``). The ``2x forward`` rule of the other tensors would count three ``d_out``
    gradients where autograd writes one."""
    return (d_out + d_in * (2 + (1 if dropout else 0))) * elem


# hashable, not frozen (read-only by convention): made for every new setup, and a frozen dataclass's
# __init__ sets each field through object.__setattr__
@dataclass(unsafe_hash=True)
class FlopCount:
    """Work of one token of a micro-batch at sequence length ``seq`` (whole model, one replica)."""

    seq: int
    forward: float  # matmul FLOPs, forward (layers + attention core + logits + adapters)
    backward: float
    recompute: float  # gradient checkpointing: forward of the layers again
    parts: dict[str, float] = field(default_factory=dict)
    six_n: float = 0.0  # 6 x active parameters, the usual shorthand, for comparison
    dequant_elements: float = 0.0  # 4/8-bit weights rebuilt per micro-batch (not per token)
    traffic_bytes: float = 0.0  # element-wise bytes moved per token (forward + backward + recompute)
    traffic_parts: dict[str, float] = field(default_factory=dict)
    gemm_kernels: float = 0.0  # matmul kernels one micro-batch launches (eager; all passes)
    other_kernels: float = 0.0  # element-wise / attention / reshape kernels one micro-batch launches
    dequant_kernels: float = 0.0  # bitsandbytes dequantize calls per micro-batch

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute

    def to_dict(self) -> dict[str, float]:
        return {"seq": self.seq, "forward": self.forward, "backward": self.backward,
                "recompute": self.recompute,
                "total": self.total, "six_n": self.six_n, **{f"part_{k}": v for k, v in self.parts.items()}}


def _active(m: Linear, top_k: int) -> int:
    """Copies of a linear a token multiplies with: top-k of the routed experts, else all (1)."""
    return min(top_k, m.count) if m.role == "expert" else m.count


def has_rotary(model: ModelSpec) -> bool:
    """Rotary position embeddings (Llama-style families, GPT-NeoX, Phi, Falcon, GPT-J); GPT-2/BLOOM/BERT
    have none. In transformers 5 these models compute them in one model-level module (``rotary_emb``)."""
    if model.family in ("llama", "moe", "deepseek", "chatglm"):
        return True
    return model.model_type in ("gpt_neox", "phi", "falcon", "gptj")


def attention_context(model: ModelSpec, seq: int, attn: str) -> float:
    """Key positions one query meets on average (see module doc)."""
    if model.architecture == "encoder" or attn == "eager":
        return float(seq)
    return (seq + 1) / 2.0


def flops_per_token(model: ModelSpec, setup: TrainSetup, seq: int | None = None) -> FlopCount:
    """Matmul FLOPs per token of a training micro-batch, element-wise traffic, and dequantization work
    (resolves the profile and dtypes; a resolved ``Run`` has :func:`flop_plan` in ``throughput``)."""
    prof = get_profile(setup.framework)
    attn = setup.attn or prof.default_attn
    targets = lora_targets(model, setup)
    plan = flop_plan(model, setup, resolve_dtypes(setup, prof), targets, attn, loss_kind(setup, prof))
    return flops_at(plan, seq or setup.seq)


# hashable, not frozen (read-only by convention): made for every new setup, and a frozen dataclass's
# __init__ sets each field through object.__setattr__
@dataclass(unsafe_hash=True)
class FlopPlan:
    """Everything of a ``FlopCount`` that does not depend on the sequence length, and the terms that do
    (attention core and eager scores, linear in the key positions a query meets) as the multipliers of
    each group of layers, replayed in the same order by :func:`flops_at` (so the sums round alike)."""

    model: ModelSpec
    attn: str
    attn_bwd: float
    parts: dict[str, float]  # the seq-independent parts; attn_fwd, attn_bwd and recompute are filled per seq
    traffic: dict[str, float]  # attention_scores filled per seq
    attn_fwd_n: tuple[int, ...]  # layers per group whose forward runs
    attn_bwd_n: tuple[int, ...]  # ... whose backward runs
    recompute: tuple[tuple[int, float, float], ...]  # (layers, linear, adapter FLOPs) recomputed
    scores_n: tuple[float, ...]  # layers x passes over the eager attention scores
    scores_bytes: float  # bytes per key position of the eager scores (0 for SDPA / flash)
    six_n: float
    dequant: float
    kernels: tuple[float, float, float]  # gemm, other, dequant
    head_dequant: float = 0.0  # a quantized, chunked lm_head: elements rebuilt per chunk (forward + backward)
    head_chunk: int = 0  # tokens per lm_head chunk (0: the head is not quantized)
    # flops_at's counts by sequence length: they depend on nothing else, so a batch sweep reuses them
    memo: dict[int, FlopCount] = field(default_factory=dict, compare=False, repr=False)


def flops_at(plan: FlopPlan, s: int) -> FlopCount:
    """The ``FlopCount`` of ``plan`` at sequence length ``s`` (kept on the plan per ``s``)."""
    kept = plan.memo.get(s)
    if kept is not None:
        return kept
    if len(plan.memo) >= 4096:
        plan.memo.clear()
    model = plan.model
    ctx = attention_context(model, s, plan.attn)
    att = 2.0 * model.n_heads * (model.head_dim + model.v_head_dim) * ctx
    parts = dict(plan.parts)
    a = 0.0
    for n in plan.attn_fwd_n:
        a += n * att
    parts["attn_fwd"] = a
    a = 0.0
    for n in plan.attn_bwd_n:
        a += n * att * plan.attn_bwd
    parts["attn_bwd"] = a
    a = 0.0
    for n, lin, ada in plan.recompute:
        a += n * (lin + att + ada)
    parts["recompute"] = a
    traffic = dict(plan.traffic)
    v = FWD_TRAFFIC_PER_BYTE * (model.n_heads * ctx * plan.scores_bytes if plan.scores_bytes else 0.0)
    a = 0.0
    for np_ in plan.scores_n:
        a += np_ * v
    traffic["attention_scores"] = a
    fwd = parts["linear_fwd"] + parts["attn_fwd"] + parts["logits_fwd"] + parts["adapter_fwd"]
    bwd = (parts["linear_bwd_input"] + parts["linear_bwd_weight"] + parts["attn_bwd"] + parts["logits_bwd"]
           + parts["adapter_bwd"])
    head = plan.head_dequant * -(-s // plan.head_chunk) if plan.head_chunk else 0.0
    out = plan.memo[s] = FlopCount(
        seq=s, forward=fwd, backward=bwd, recompute=parts["recompute"], parts=parts, six_n=plan.six_n,
        dequant_elements=plan.dequant + head, traffic_bytes=sum(traffic.values()), traffic_parts=traffic,
        gemm_kernels=plan.kernels[0], other_kernels=plan.kernels[1], dequant_kernels=plan.kernels[2])
    return out


class LayerWork(NamedTuple):
    """One decoder layer of a group, per token, forward: what ``flop_plan`` multiplies by passes."""

    lin: float  # linear FLOPs (the routed experts a token visits)
    ada: float  # LoRA adapter FLOPs
    produced: float  # bytes the layer writes: linear outputs and element-wise results
    ada_bytes: float  # bytes the adapters write in forward
    ada_bwd_bytes: float  # ... and in backward, op by op
    ops: float  # element-wise, attention and reshape kernels
    gemms: float  # matmul kernels (the attention kernel counted once)
    qlin: float  # linears, each a copy a token visits (quantized: one dequantization each per pass)
    ada_fwd_reads: float = 0.0  # bytes lora_A's GEMMs read from the layer input no other count has
    ada_bwd_reads: float = 0.0  # bytes the lora_A weight-gradient GEMMs read (their saved input)
    # grouped_mm's weight gradient of LoRA'd fused expert stacks (estimator/fused_expert_lora.py): 2 k d_in
    # d_out per stack, made although the base weight is frozen (the effective weight needs it)
    stack_wgrad: float = 0.0


def layer_work(spec: LayerSpec, model: ModelSpec, setup: TrainSetup, dt: Dtypes, targets: frozenset[str],
               attn: str) -> LayerWork:
    """Per linear: ``2 d_in d_out`` FLOPs and a ``d_out`` output; per targeted linear an adapter of
    ``2 r (d_in + d_out)`` FLOPs writing its dropout output, ``r`` and three ``d_out`` tensors (lora_B,
    scaling, add) in two GEMMs and 2-3 element-wise kernels. Then the norms (``NORM_*_TENSORS``), two
    residual adds, rotary (``ROTARY_TENSORS`` over q and k), the attention output and its contiguous
    copy, and the activation (and gate product) of the MLP."""
    c = dt.compute
    h = model.hidden
    dropout = (setup.dropout or 0.0) > 0
    lin = ada = 0.0
    produced = 0.0
    ada_bytes = 0.0
    ada_bwd_bytes = 0.0
    ada_reads = 0.0
    ops = 0.0
    gemms = 1.0  # the attention kernel (SDPA/flash) or the two batched matmuls of eager, counted once
    qlin = 0.0
    model_code = get_profile(setup.framework).model_code
    top_k, rank, wide = spec.top_k, setup.rank, max(dt.adapter, c)  # read once, not per linear
    for m in spec.linears:
        k = _active(m, top_k)
        lin += 2.0 * m.d_in * m.d_out * k
        produced += m.d_out * k * c
        gemms += k
        if quantized(m, model_code):  # fused experts / routers stay 16-bit under transformers (bnb_scope)
            qlin += k
        if m.name in targets:
            ada += 2.0 * rank * (m.d_in + m.d_out) * k
            # dropout output (if any), lora_A out, then lora_B out, scaling and the add at d_out
            ada_bytes += ((m.d_in if dropout else 0) * dt.adapter + rank * dt.adapter
                          + 3 * m.d_out * wide) * k
            ada_bwd_bytes += _adapter_backward_bytes(m.d_in, m.d_out, dropout, wide) * k
            ada_reads += m.d_in * wide * k
            gemms += 2 * k
            ops += 2 + (1 if dropout else 0)
    produced += spec.n_norms * h * (NORM_FP32_TENSORS * 4 + NORM_HALF_TENSORS * dt.norm_out)
    produced += 2 * h * dt.residual  # two residual adds
    ops += spec.n_norms * (NORM_FP32_TENSORS + NORM_HALF_TENSORS) + 2
    if has_rotary(model):
        produced += ROTARY_TENSORS * model.head_dim * (model.n_heads + model.n_kv_heads) * c
        ops += 2 * ROTARY_TENSORS
    produced += 2 * model.n_heads * model.v_head_dim * c  # attention output + contiguous copy for o_proj
    ops += 3  # q/k/v reshapes / transposes
    f_mlp = (spec.expert_intermediate * spec.top_k if spec.moe else 0) + spec.mlp_intermediate
    gated = model.mlp_kind == "swiglu"
    produced += (2 if gated else 1) * f_mlp * c  # activation (and the gate product)
    ops += 2 if gated else 1
    if attn == "eager":
        ops += 3
    # LoRA's matmuls are memory-bound (``gemm_efficiency``: intensity 2 r / e FLOP per byte): their operand
    # bytes are their time. The tensors they write are counted above; lora_A's read of its input is not
    # where no dropout output stands between (that output's read is its write's pair), nor is the read of
    # its saved input by the weight-gradient matmul ``dW_A = x^T g``.
    stacks = expert_stacks(spec, targets, setup.rank)
    stack_wgrad = sum(2.0 * st.d_in * st.d_out * spec.top_k for st in stacks)
    return LayerWork(lin, ada, produced, ada_bytes, ada_bwd_bytes, ops, gemms, qlin,
                     0.0 if dropout else ada_reads, ada_reads, stack_wgrad)


@dataclass
class _Tally:
    """The sums ``flop_plan`` builds over the groups of layers."""

    parts: dict[str, float]
    traffic: dict[str, float]
    attn_fwd_n: list[int] = field(default_factory=list)
    attn_bwd_n: list[int] = field(default_factory=list)
    recompute: list[tuple[int, float, float]] = field(default_factory=list)
    scores_n: list[float] = field(default_factory=list)
    kernels: dict[str, float] = field(default_factory=lambda: {"gemm": 0.0, "other": 0.0, "dequant": 0.0})


def _add_layers(t: _Tally, n: int, grad_flows: bool, w: LayerWork, setup: TrainSetup,
                frozen_weight_grads: bool = False) -> None:
    """``n`` layers alike: forward always; when the gradient flows through them, the input-gradient
    matmuls (``1x`` forward), the weight gradients when the layer trains or its frozen weights get
    gradients anyway (``frozen_weight_grads``), the adapters' ``2x``, and the recompute under checkpointing.
    Traffic and kernels scale by the passes (``1 + BWD_*_PER_FWD``, ``+1`` recompute); the adapters'
    backward traffic is counted op by op."""
    trained_layer = (setup.method == "full" or (setup.method == "freeze" and grad_flows)
                     or frozen_weight_grads)
    t.parts["linear_fwd"] += n * w.lin
    t.attn_fwd_n.append(n)
    t.parts["adapter_fwd"] += n * w.ada
    passes = kpasses = 1.0
    if grad_flows:
        t.parts["linear_bwd_input"] += n * w.lin
        t.attn_bwd_n.append(n)
        t.parts["adapter_bwd"] += n * 2 * w.ada
        if trained_layer:
            t.parts["linear_bwd_weight"] += n * w.lin
        else:
            t.parts["linear_bwd_weight"] += n * w.stack_wgrad
        if frozen_weight_grads:
            # the weight-gradient matmul autograd adds for every frozen linear, beyond the LoRA backward
            # that BWD_KERNELS_PER_FWD counts (one matmul per frozen linear)
            t.kernels["gemm"] += n * w.qlin
        passes += BWD_TRAFFIC_PER_FWD
        kpasses += BWD_KERNELS_PER_FWD
        if setup.gradient_checkpointing:
            t.recompute.append((n, w.lin, w.ada))
            passes += 1.0
            kpasses += 1.0
    fwd_t = {"layers": FWD_TRAFFIC_PER_BYTE * w.produced, "adapters": FWD_TRAFFIC_PER_BYTE * w.ada_bytes}
    for key, v in fwd_t.items():
        if key == "adapters" and grad_flows:  # its backward is counted op by op, not 2x forward
            t.traffic[key] += n * ((passes - BWD_TRAFFIC_PER_FWD) * v
                                   + FWD_TRAFFIC_PER_BYTE * w.ada_bwd_bytes)
        else:
            t.traffic[key] += n * passes * v
    fwd_passes = 1.0 + (1.0 if grad_flows and setup.gradient_checkpointing else 0.0)
    t.traffic["adapters"] += n * (fwd_passes * w.ada_fwd_reads + (w.ada_bwd_reads if grad_flows else 0.0))
    t.scores_n.append(n * passes)
    t.kernels["gemm"] += n * kpasses * w.gemms
    t.kernels["other"] += n * kpasses * w.ops
    if setup.quant_bits:
        deq_passes = 1 + ((2 if setup.gradient_checkpointing else 1) if grad_flows else 0)
        t.kernels["dequant"] += n * deq_passes * w.qlin


def flop_plan(model: ModelSpec, setup: TrainSetup, dt: Dtypes, targets: frozenset[str], attn: str,
              loss: str, quant_head_chunk: int = 0, frozen_weight_grads: bool = False) -> FlopPlan:
    """The shape-independent work of one token (see the module doc); ``flops_at`` adds the attention.
    ``quant_head_chunk``: the framework quantizes the lm_head too and applies it in chunks of that many
    tokens (LitGPT: ``lm_head_chunk_size=128``): each chunk rebuilds the whole head, in forward and again for
    its input gradient (bitsandbytes ``MatMul4Bit.backward``). ``frozen_weight_grads``: the backward also
    makes the weight gradient of every frozen block linear (``wrappers.fsdp.frozen_weights_get_gradients``:
    an FSDP unit whose flat parameter mixes frozen and trainable weights requires grad as a whole).

    Layers below the trained top of ``method=freeze`` run forward only. Logits: ``2 h vocab`` forward and
    the input gradient (plus the weight gradient in a full fine-tune); the loss chain moves
    ``LOSS_BYTES_PER_LOGIT`` per logit; dequantization rebuilds every linear weight per matmul pass
    (forward, input gradient, recompute)."""
    n_layers = model.n_layers
    first_trained = n_layers - min(setup.freeze_trainable_layers, n_layers) if setup.method == "freeze" else 0
    t = _Tally(parts={k: 0.0 for k in ("linear_fwd", "attn_fwd", "logits_fwd", "adapter_fwd",
                                       "linear_bwd_input", "linear_bwd_weight", "attn_bwd", "logits_bwd",
                                       "adapter_bwd", "recompute")},
               traffic={k: 0.0 for k in ("layers", "adapters", "attention_scores", "loss", "embedding")})
    layer_no = 0
    for spec, count in model.layer_groups:
        w = layer_work(spec, model, setup, dt, targets, attn)
        # layers of this group below / inside the trained top (method=freeze), else all trained alike
        n_frozen = min(count, max(0, first_trained - layer_no)) if setup.method == "freeze" else 0
        layer_no += count
        for n, grad_flows in ((n_frozen, False), (count - n_frozen, True)):
            if n:
                _add_layers(t, n, grad_flows, w, setup, frozen_weight_grads)
    h = model.hidden
    logits = 2.0 * h * model.head_width
    t.parts["logits_fwd"] = logits
    t.parts["logits_bwd"] = logits * (2 if setup.method == "full" else 1)  # weight grad only when it trains
    t.traffic["loss"] = LOSS_BYTES_PER_LOGIT.get(loss, 14.0) * model.head_width * FWD_TRAFFIC_PER_BYTE
    t.traffic["embedding"] = FWD_TRAFFIC_PER_BYTE * 2 * h * dt.residual  # gather + final norm input
    t.kernels["gemm"] += 2 + (1 if setup.method == "full" else 0)  # lm_head forward, input and weight grads
    t.kernels["other"] += 2 * (1 + BWD_KERNELS_PER_FWD) + 8  # embedding, final norm, the loss chain (~8)
    bits = setup.quant_bits
    dequant = 0.0
    if bits:
        passes = 2 + (1 if setup.gradient_checkpointing else 0)  # forward, input-grad matmul, recompute
        # only the linears bitsandbytes replaced are rebuilt (transformers' fused experts are not: bnb_scope)
        dequant = passes * quantized_weights(model, get_profile(setup.framework).model_code)
    # eager attention: scores (+mask), fp32 softmax, its 16-bit cast, per head per key position
    scores_bytes = float(dt.compute + 4 + dt.compute) if attn == "eager" else 0.0
    return FlopPlan(model=model, attn=attn, attn_bwd=ATTN_BWD_EAGER if attn == "eager" else ATTN_BWD_FLASH,
                    parts=t.parts, traffic=t.traffic, attn_fwd_n=tuple(t.attn_fwd_n),
                    attn_bwd_n=tuple(t.attn_bwd_n), recompute=tuple(t.recompute), scores_n=tuple(t.scores_n),
                    scores_bytes=scores_bytes, six_n=6.0 * model.params_active, dequant=dequant,
                    kernels=(t.kernels["gemm"], t.kernels["other"], t.kernels["dequant"]),
                    head_dequant=2.0 * model.lm_head_params if bits and quant_head_chunk else 0.0,
                    head_chunk=quant_head_chunk if bits else 0)
