"""Activations saved for backward, per token, from the operations each layer runs.

A small ledger walks one decoder layer the way PyTorch autograd sees it and records what each op keeps
for backward (``torch.autograd`` saves an operand only when the other operand needs a gradient):
- a Linear keeps its input when its weight trains (full / freeze) or a LoRA adapter reads it; modules
  reading the same tensor share one saved copy, unless a dtype cast per module makes a copy each (autocast
  casting an fp32 input, PEFT casting to the fp32 adapter dtype);
- RMSNorm as transformers writes it (``hidden.to(float32)``, ``pow``, ``rsqrt``, ``weight * x``) keeps
  the fp32 input (4h) and, when its weight trains, the normalized output; LayerNorm keeps its input;
- SwiGLU keeps gate-out (SiLU input), SiLU-out and up-out (both mul operands), and the product when
  down_proj needs it; a GELU MLP the fc1 output (and three more for transformers' python ``gelu_new``);
- SDPA / flash keep q, k, v, the output and the fp32 log-sum-exp; eager keeps the fp32 softmax output
  and its 16-bit cast (6 bytes per score) instead of O(s) state; transformers' SDPA path repeats
  grouped K/V heads before the kernel (``repeat_kv``) while flash-attention reads them grouped;
- under gradient checkpointing only each layer's input is kept, and one layer is recomputed in backward.

Derivation for a Llama layer, full fine-tune, pure bf16, SDPA with un-repeated K/V: (22h + 4 h_kv + 8f + 4a)
bytes per token (prior-art notes, e.4), which the tests rederive by hand.

The walk and its primitives: ``layer_walk.py``; the attention block: ``attention_saved.py``; this file
the MLP / MoE block and the layer's record with its backward temporaries (a MoE's output: expert_output.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from tuneplan.estimator.attention_saved import attention_block
from tuneplan.estimator.bnb_scope import expert_stack_bytes
from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.expert_grouped_mm import walk_linear
from tuneplan.estimator.expert_output import expert_output_backward
from tuneplan.estimator.fused_expert_lora import expert_stacks
from tuneplan.estimator.fused_layers import unsloth_fast_lora_layer
from tuneplan.estimator.layer_walk import LayerWalk
from tuneplan.estimator.lora_bottom_layer import parallel_block
from tuneplan.estimator.recompute_adapter import recompute_adapter_temp
from tuneplan.estimator.recompute_dequant import down_dequant_reached, record_down_dequant
from tuneplan.estimator.saved_tensors import LayerActs
from tuneplan.specs.model import LayerSpec, Linear, ModelSpec
from tuneplan.specs.setup import TrainSetup

PYTHON_GELU = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh_py")  # transformers NewGELUActivation etc.


def layer_activations(
    model: ModelSpec, spec: LayerSpec, setup: TrainSetup, dtypes: Dtypes, targets: frozenset[str],
    trainable: bool, attn: str, python_model_code: bool, quant_saves_input: bool = False,
    input_requires_grad: bool = True, litgpt_code: bool = False, expand_kv: bool = False,
    unsloth_code: bool = False,
) -> LayerActs:
    """What one layer keeps per token: the attention block, the MLP / MoE block, the extra norms, and the
    activation gradients live while it is back-propagated (see the module docstring)."""
    if unsloth_code:
        fast = unsloth_fast_lora_layer(model, spec, setup, dtypes, targets)
        if fast is not None:
            return fast
    walk = LayerWalk(model, spec, setup, dtypes, targets, trainable, python_model_code, quant_saves_input,
                  input_requires_grad, litgpt_code, expand_kv)
    per_pos, attn = attention_block(walk, attn)
    before_mlp = walk.ledger.total()
    mlp_block(walk)
    mlp_saved = walk.ledger.total() - before_mlp
    for i in range(max(spec.n_norms - 2, 0)):  # Gemma 2/3, GLM-4: post-attention / post-MLP norms
        walk.norm(f"post_norm{i}", model.hidden)
    return _with_backward(walk, per_pos, attn, mlp_saved)


def mlp_block(walk: LayerWalk) -> None:
    """The MLP block: its norm (none in a parallel block, which reads the attention's normalized input), the
    router and its fp32 expert probabilities, the routed experts (each token's top-k copies gathered) and
    shared experts, or the dense MLP (``feed_forward``)."""
    model, spec, ledger, targets = walk.model, walk.spec, walk.ledger, walk.targets
    hidden = model.hidden
    shared_norm = model.family == "gpt" and spec.n_norms == 1
    mlp, experts, routers = spec.mlp_linears, spec.expert_linears, spec.router_linears
    # A parallel block (Phi / GPT-J shared norm, GPT-NeoX use_parallel_residual) feeds its MLP from the layer
    # input, not from the attention: in the first layer LoRA trains, whose input needs no gradient, an MLP
    # without adapters is outside the graph and keeps nothing (simulate: Pythia-6.9B layer 0, -12h per token)
    parallel = parallel_block(model, spec)
    if (parallel and not walk.input_requires_grad and not walk.trainable
            and not any(m.name in targets for m in mlp + experts + routers)):
        mlp, experts, routers = (), (), ()
    elif spec.n_norms >= 1 and not shared_norm:
        if parallel and not walk.input_requires_grad:
            # the MLP's own norm reads the layer input, which needs no gradient here (simulate: Pythia-6.9B
            # QLoRA, layer 0's post_attention_layernorm keeps no input)
            walk.gradient_free.add("mlp_in")
        walk.norm("mlp_norm", hidden, "mlp_in" not in walk.gradient_free)
        if (parallel and model.norm_kind != "rms" and "attn_norm.in" in ledger.items
                and (not walk.ln_fp32 or walk.input_fp32)):
            # GPT-NeoX's parallel residual runs ``post_attention_layernorm(hidden_states)`` on the layer
            # input that ``input_layernorm`` read (transformers gpt_neox GPTNeoXLayer.forward; Falcon's
            # ``ln_attn`` / ``ln_mlp``): both native_layer_norm nodes save that one storage, unless autocast
            # casts a 16-bit input for each norm (simulate: Pythia-6.9B LoRA fp32, 4h per token per layer
            # less; Falcon-40B QLoRA fp16-mixed, one fp32 layer input per layer)
            ledger.items.pop("mlp_norm.in", None)
    # parallel attention + MLP under one norm (Phi, GPT-J, Falcon-7B): the MLP reads the attention's
    # normalized input, the same tensor, so what both save is one storage
    mlp_reads = "attn_in" if shared_norm else "mlp_in"
    for m in routers:
        walk.linear(m.name, m.reads, m.d_in)
        ledger.save(m.name + ".probs_fp32", 4 * m.d_out)  # softmax over experts in fp32
    if experts:
        top_k = spec.top_k
        # Each routed copy of a token is gathered (index_select) before the expert matmuls.
        if walk.trainable or any(m.name in targets for m in experts):
            ledger.save("expert_gathered", walk.compute_bytes * hidden * top_k)
        stacks = fused_stacks_saved(walk, experts)
        feed_forward(walk, experts, spec.expert_intermediate, float(top_k), "expert.", mlp_reads, stacks)
        ledger.save("expert_weighted_out", walk.output_bytes * hidden * top_k)
        shared = [m for m in mlp if m.role == "shared_expert"]
        feed_forward(walk, shared, spec.mlp_intermediate, 1.0, "shared.", mlp_reads)
    else:
        feed_forward(walk, mlp, spec.mlp_intermediate or model.intermediate, 1.0, "mlp.", mlp_reads)


def feed_forward(walk: LayerWalk, mods: Sequence[Linear], width: int, share: float, prefix: str,
                 mlp_reads: str, weight_grad: frozenset[str] = frozenset()) -> None:
    """One feed-forward of ``width`` inner features, run on ``share`` copies of each token: SwiGLU keeps
    gate-out, SiLU-out and up-out (3 x width x output bytes; compiled, SiLU is recomputed); a GELU MLP its
    fc1 output, plus three intermediates of a Python GELU (fp32 under autocast: pow upcasts); the down
    projection keeps its input when it trains or is adapted (``weight_grad``: the reads of LoRA'd fused
    expert stacks, whose grouped_mm keeps its input for the weight gradient)."""
    if not mods:
        return
    model, ledger, output_bytes = walk.model, walk.ledger, walk.output_bytes
    hidden_act = str(model.config.get("hidden_act", model.config.get("activation_function", "")))
    # the up projection's output: fp32 from a 4-bit linear reading autocast's fp32 LayerNorm output
    # (layer_walk.out_bytes; simulate: phi-1_5 and Pythia-6.9B QLoRA, fc1's output and 0.5 * x in fp32)
    output_bytes = walk.out_bytes(mlp_reads)
    mid_bytes = output_bytes
    for m in mods:
        if m.reads == "mlp_in":
            reads = mlp_reads if share == 1.0 else prefix + "gathered"
            walk_linear(walk, m, reads, share, m.reads in weight_grad)
    if model.mlp_kind == "swiglu":
        ledger.save(prefix + "gate_out", output_bytes * width * share)
        if not walk.setup.compile:  # compiled, SiLU is recomputed from gate_out in backward
            ledger.save(prefix + "silu_out", output_bytes * width * share)
        ledger.save(prefix + "up_out", output_bytes * width * share)
    elif walk.python_model_code and hidden_act in PYTHON_GELU and walk.dtypes.autocast:
        # 0.5 * x * (1 + tanh(k * (x + 0.044715 * pow(x, 3)))) under CUDA autocast: pow casts x to an fp32
        # copy and keeps it, so everything after it is fp32: tanh's output and (1 + tanh) are kept, and
        # 0.5 * x (16-bit) for the product; x itself is not (transformers NewGELUActivation)
        ledger.save(prefix + "gelu_parts", (3 * 4 + output_bytes) * width * share)
        mid_bytes = 4
    else:
        ledger.save(prefix + "fc1_out", output_bytes * width * share)
        if walk.python_model_code and hidden_act in PYTHON_GELU:
            ledger.save(prefix + "gelu_parts", 3 * output_bytes * width * share)
    for m in mods:
        if m.reads == "mlp_mid":
            key_in = prefix + "mid"
            walk.inputs_dtype[key_in] = mid_bytes
            before = len(walk.ledger.items)
            walk_linear(walk, m, key_in, share, m.reads in weight_grad)
            # its new keys, last in the ledger: the adapter-private ones (dropout output / cast input, mask)
            new = dict(islice(walk.ledger.items.items(), before, None))
            walk.down_adapter_private += sum(v for k, v in new.items()
                                             if k.endswith((".lora_in", ".dropout_mask")))
            walk.down_adapter_input += sum(v for k, v in new.items() if k.endswith(".lora_in"))
            record_down_dequant(walk, key_in, m, new, mlp_reads, residual_grads(model))
            # without a private copy lora_A keeps the product itself; when nothing else does (a frozen or
            # 4-bit base linear saves no input) it goes with lora_A's backward all the same
            if key_in in new and key_in in walk.adapter_only_inputs:
                walk.down_adapter_private += new[key_in]
                walk.down_adapter_input += new[key_in]
            if walk.fsdp_adapter_input_copy and any(k.endswith(".dropout_mask") for k in new):
                # the fp32 input PEFT casts for the upcast adapter, dropped out (down_adapter_backward)
                walk.down_adapter_dropout += 2 * 4 * m.d_in * share


def fused_stacks_saved(walk: LayerWalk, experts: Sequence[Linear]) -> frozenset[str]:
    """The LoRA'd fused expert stacks of this layer (estimator/fused_expert_lora.py): their effective
    weights ``baddbmm(W, B, A)`` (E d_in d_out x W's bytes each) kept by grouped_mm for its input gradient,
    gate_up_proj's when the MLP input needs a gradient, down_proj's when its input does (the MLP input
    does, or gate_up_proj is adapted); as the layer's backward temporary, each stack's weight gradient (made
    in W's dtype, down_proj's first) less the effective weights released before it: max(down, gate_up -
    down's saved weight). Returns the reads (mlp_in / mlp_mid) whose input grouped_mm keeps."""
    stacks = expert_stacks(walk.spec, walk.targets, walk.setup.rank)
    if not stacks:
        return frozenset()
    dtypes = walk.dtypes
    weight_bytes = expert_stack_bytes(walk.setup.quant_bits, dtypes)  # QLoRA: not quantized (bnb_scope)
    input_grad = "mlp_in" not in walk.gradient_free
    up_adapted = any(st.name == "gate_up_proj" for st in stacks)
    released = 0.0  # effective weights already released when a stack's weight gradient is made
    for st in reversed(stacks):  # backward: down_proj first
        kept = input_grad or (st.name == "down_proj" and up_adapted)
        saved = float(st.weight_numel * weight_bytes) if kept else 0.0
        walk.per_layer += saved
        walk.backward_per_layer = max(walk.backward_per_layer, st.weight_numel * weight_bytes - released)
        released += saved
        if walk.setup.gradient_checkpointing and dtypes.adapter > weight_bytes:
            # the recomputed layer's factor casts .to(W.dtype), which baddbmm keeps (outside checkpointing
            # weights.stack_params / param_plan count them with the adapters' casts)
            walk.per_layer += st.adapter_params * weight_bytes
    # beside the first stack's weight gradient (down_proj's, when adapted: the layer's saved tensors all
    # still there), the gradients of its output and of its input, k (d_in + d_out) per token, and the
    # residual's two (simulate: DeepSeek-V2-Lite checkpointed, peak at down_proj's grouped_mm backward)
    first = stacks[-1]
    walk.backward_per_layer_per_token = (walk.output_bytes * walk.spec.top_k * (first.d_in + first.d_out)
                                         + walk.dtypes.residual * 2 * walk.model.hidden)
    reads = {"gate_up_proj": "mlp_in", "down_proj": "mlp_mid"}
    return frozenset(reads[st.name] for st in stacks)


def _with_backward(walk: LayerWalk, per_pos: float, attn: str, mlp_saved: float) -> LayerActs:
    """The layer's record, with the activation gradients live while it is back-propagated.

    At the MLP's gated product (simulate: Llama-2-7B QLoRA peaks inside the top layer at aten.mul): the
    gradient of down_proj's input and the two products' gradients (gate and up branches), three MLP-wide
    tensors in the MLP's output dtype, next to the residual gradients (:func:`residual_grads`):
    out_b x 3 x width + residual x n h per token. The eager score gradients
    ((4 + g) bytes per head per key position: the fp32 probabilities' and the scores', g = 2 from fp16 scores
    through the half-to-float softmax, else 4) come later, in the
    attention's backward, once the MLP block's saved tensors are gone (simulate: BERT-large fp16-mixed, 3
    layers, peaks in the forward)."""
    model, spec, dtypes, hidden = walk.model, walk.spec, walk.dtypes, walk.model.hidden
    width = max(spec.mlp_intermediate, spec.expert_intermediate * max(spec.top_k, 1), 1)
    product = max(down_adapter_backward(walk, width, product_grad_bytes(walk)), expert_output_backward(walk))
    backward_temp = product + dtypes.residual * residual_grads(model) * hidden
    backward_temp = max(backward_temp, recompute_adapter_temp(walk, residual_grads(model)))
    if walk.down_adapter_dropout:
        # FSDP1's dropout moment, inside the down projection's adapter branch: two residual gradients beside
        # it (simulate: FSDP1 LLaMA-Factory, Mistral-7B LoRA fp16-mixed, at native_dropout_backward)
        dropout = walk.down_adapter_dropout - walk.down_adapter_input
        backward_temp = max(backward_temp, dropout + dtypes.residual * 2 * hidden)
    # the gradients of the fp32 probabilities and of the scores, beside the probabilities softmax saved: the
    # rest of the saved scores is released by then (walk.scores_released); none without autograd attention
    eager_scores = (attn == "eager" or per_pos) and "attn_core" not in walk.gradient_free
    backward_temp_per_pos = ((4.0 + walk.scores_grad_bytes) * model.n_heads - walk.scores_released
                             if eager_scores else 0.0)
    first_saved, first_temp, first_per_pos = first_target_terms(walk, per_pos)
    last_saved, last_temp = last_target_terms(walk, per_pos)
    return LayerActs(per_token=walk.ledger.total(), per_token_per_pos=per_pos, backward_temp=backward_temp,
                     backward_temp_per_pos=backward_temp_per_pos,
                     pinned=sum(walk.ledger.items[key] for key in walk.pinned_keys),
                     attn_backward_offset=dtypes.residual * 2 * hidden - mlp_saved
                     - released_before_scores(walk),
                     input_alias=walk.input_alias, per_layer=walk.per_layer,
                     backward_per_layer=walk.backward_per_layer, recompute_dequant=down_dequant_reached(walk),
                     backward_per_layer_per_token=walk.backward_per_layer_per_token, mlp_saved=mlp_saved,
                     first_target_saved=first_saved, first_target_temp=first_temp,
                     first_target_per_pos=first_per_pos,
                     last_target_saved=last_saved, last_target_temp=last_temp)


def residual_grads(model: ModelSpec) -> int:
    """Hidden-wide residual gradients live at the MLP's backward moment. SwiGLU (pre-norm): one, the
    incoming gradient of the layer's output, which the residual add's backward (AddBackward0) hands to the
    MLP branch as the same tensor and the autograd engine's input buffer holds for the sum at the layer's
    input; the down projection's output-gradient casts die with its backward, before its input gradients
    are summed (simulate: Llama-2-13b QLoRA all-linear, ZeRO-2 checkpointed, one bf16 h-wide gradient at
    the down projection's ``aten.add``; FSDP2 Llama-2-7B LoRA checkpointed, at ``aten.mul``). Other MLPs:
    two, the incoming gradient and its accumulated copy (not re-derived for them)."""
    return 1 if model.mlp_kind == "swiglu" else 2


def first_target_terms(walk: LayerWalk, per_pos: float) -> tuple[float, float, float]:
    """(bytes per token the layer still keeps, activation gradients per token live) when its first LoRA
    adapter F (forward order) starts its backward, the moment PEFT's per-adapter FSDP units prefetch the
    next layer (wrappers/fsdp.fsdp_layers_gathered). Autograd runs the node recorded last first: every op
    recorded after F (F's siblings reading the same input, the attention, the MLP) has been
    back-propagated and its saved tensors released, so the layer keeps what it saved up to F (the walk's
    ledger then). Live beside: the gradient of F's output (d_out wide, the linears' output dtype), the
    gradient of F's input its siblings accumulated (d_in wide) and the residual stream's two::

        temp = out_b (d_out + d_in) + residual_b 2 h

    (simulate: FSDP1, Qwen3-32B LoRA fp32 under checkpointing: q_proj's adapter at the top layer's end,
    92.8 MB at 1024 tokens = 32 + 20 + 40). Third: per token per key position, the O(s) part an eager
    attention F follows saved (not in the ledger; back-propagated after F). (0, 0, 0) without an adapter or a
    sharded wrapper (``walk.target_moments``); (-1, 0, 0) where F is no dense attention or MLP projection."""
    if walk.first_target is None or not walk.target_moments:
        return 0.0, 0.0, 0.0
    saved, name, reads = walk.first_target
    linear = walk.spec.by_name.get(name)
    if linear is None or linear.role not in ("attn", "mlp"):
        return -1.0, 0.0, 0.0
    temp = (walk.output_bytes * (linear.d_out * linear.count + linear.d_in)
            + walk.dtypes.residual * 2 * walk.model.hidden)
    return saved, max(float(temp), input_norm_backward(walk) - saved), per_pos if reads != "attn_in" else 0.0


def last_target_terms(walk: LayerWalk, per_pos: float) -> tuple[float, float]:
    """(bytes per token the layer still keeps, activation gradients per token live) when the gradient of
    its last LoRA adapter L (forward order) is ready, the layer's first trained gradient in backward:
    autograd runs the node recorded last first, so every op recorded after L (the MLP, and after a q/k/v
    projection the attention core) has been back-propagated and its saved tensors released; the layer
    keeps what it saved up to L (the walk's ledger then). Live beside, and through the rest of the layer's
    backward: the output gradients of the projections reading the attention input (q, k, v: the core's
    backward makes them together), the gradient of their input they accumulate and the residual
    stream's two; after an output projection L also the core's output gradient::

        temp = max(out_b (sum_qkv d_out + h [+ d_in(L)]) + residual_b 2 h, norm - saved)

    with ``norm`` the input RMSNorm's backward moment (input_norm_backward). (0, 0) where L is the MLP's
    (its gradient comes first in the layer: nothing of the layer precedes it), there is no adapter or no
    sharded wrapper (``walk.target_moments``); (-1, 0) where the attention core's backward follows L and
    is eager (its O(s) scratch) or L is not a dense layer's attention projection."""
    if walk.last_target is None or not walk.target_moments:
        return 0.0, 0.0
    saved, name, reads = walk.last_target
    linear = walk.spec.by_name.get(name)
    if linear is not None and linear.role == "mlp":
        return 0.0, 0.0
    if linear is None or linear.role != "attn" or reads not in ("attn_in", "attn_core") or (
            per_pos and reads != "attn_in"):
        return -1.0, 0.0
    hidden = walk.model.hidden
    width = walk.spec.qkv_width + hidden + (linear.d_in if reads == "attn_core" else 0)
    temp = walk.output_bytes * width + walk.dtypes.residual * 2 * hidden
    # and, the layer's last moment, its input RMSNorm's backward (input_norm_backward)
    return saved, max(float(temp), input_norm_backward(walk) - saved)


def input_norm_backward(walk: LayerWalk) -> float:
    """Bytes per token of the layer the moment its input RMSNorm back-propagates, after every adapter
    (the next layer already gathered): what the norm saved (its fp32 input, rstd) and the fp32 gradients
    live at pow's backward. transformers' RMSNorm runs ``x32 = x.to(float32); var = x32.pow(2).mean(-1);
    x32 * rsqrt(var + eps)`` (LlamaRMSNorm.forward; Gemma's ``_norm`` alike); its backward holds, all
    h wide in fp32: the product's gradient to x32 (``grad * rstd``), mean's (``sum_backward / numel``: a
    div), and pow's ``grad * (2 * x32.pow(1))`` (torch FunctionsManual.cpp pow_backward: the pow and its
    scaled copy live until the expression's end beside the product): 5 x 4h, next to the residual
    gradient, residual_b h::

        norm = fp32_in + rstd + 20 h + residual_b h

    (simulate: FSDP1, DeepSeek-R1-Distill-Llama-8B LoRA under checkpointing: 5 x 48 MB fp32 + 24 MB at
    3072 tokens, layer 2's input_layernorm). 0 where the walk keeps no fp32 norm input (compiled, a
    LayerNorm, a first layer whose input needs no gradient)."""
    items = walk.ledger.items
    if "attn_norm.fp32_in" not in items:
        return 0.0
    hidden = walk.model.hidden
    return (items["attn_norm.fp32_in"] + items.get("attn_norm.rstd", 0.0)
            + 5 * 4 * hidden + walk.dtypes.residual * hidden)

def released_before_scores(walk: LayerWalk) -> float:
    """Bytes per token of the attention's own saved tensors already released when eager attention's scores
    gradient is made. Autograd runs a layer's nodes in reverse and each frees what it saved once it has run
    (torch/csrc/autograd: ``SavedVariable`` released after ``apply`` without ``retain_graph``; a checkpointed
    layer's recomputed tensors are handed out once, utils/checkpoint.py ``unpack_hook``). Before the scores'
    backward (``ToCopyBackward`` / ``SoftmaxBackward`` of transformers' ``eager_attention_forward``) have run:
    the output projection (its saved input, or its LoRA adapter's private copy, mask and r-wide middle), the
    output dropout (its mask), and probs @ V, which releases the V it saved (repeated to every head) with its
    probabilities (``walk.scores_released``)::

        released = saved(o_proj) + mask(attn_out_dropout) + V

    (simulate: Llama-3-8B QLoRA all-linear, eager, fp16 autocast: at the top layer's ToCopyBackward only q,
    k, the norm's fp32 input and q/k/v's adapter tensors remain of the attention's.)"""
    items = walk.ledger.items
    return walk.attn_out_saved + items.get("attn_out_dropout_mask", 0.0) + items.get("v_attn", 0.0)


def product_grad_bytes(walk: LayerWalk) -> int:
    """Bytes per element of the MLP product's gradients: the product's own dtype. A Python GELU under
    autocast (transformers NewGELUActivation ``0.5 * x * (1 + tanh(...))``, ``pow`` on CUDA autocast's fp32
    list) ends in an fp32 product (16-bit ``0.5 * x`` times the fp32 ``1 + tanh``), which the down
    projection's autocast casts to 16 bits: its backward (``ToCopyBackward``) hands an fp32 gradient to the
    product's ``MulBackward0``, whose two gradients are fp32 too (torch/csrc/autograd engine
    ``validate_outputs`` casts each to its input's dtype only after the node has returned both); the
    walk records that fp32 product as the down projection's input (``feed_forward``: ``mlp.mid``)."""
    return max(walk.output_bytes, walk.inputs_dtype.get("mlp.mid", 0))


def down_adapter_backward(walk: LayerWalk, width: int, out_b: int | None = None) -> float:
    """The MLP's backward temporaries per token, at the costlier of two moments of the down projection's
    backward. PEFT's LoRA forward is ``base(x) + lora_B(lora_A(dropout(x))) * scaling`` (peft
    tuners/lora/layer.py and bnb.py, Linear.forward); autograd runs the adapter branch first (higher
    sequence numbers), and each node frees what it saved once it has run (torch's non-reentrant checkpoint
    hands a recomputed tensor out once: utils/checkpoint.py, unpack_hook).

    * lora_A's backward (``mm``): every saved tensor of the layer still live, and the new gradient of
      its (private) input, of that input's size and dtype: ``I``;
    * the gated product's backward: the down projection's input gradient and the two products' gradients,
      ``3 x out_b x width``, once lora_A's saved input (the dropout output, or the adapter's private cast
      copy) and the dropout mask are freed: ``- P`` with P those adapter-private bytes.

    * under FSDP1 as the HF Trainer runs it, the dropout's backward (``layer_walk.fsdp1_adapter_input_copy``:
      accelerate's fp32 adapters, so PEFT's ``lora.Linear.forward`` casts the 16-bit input to fp32 before
      ``lora_A(dropout(x))`` and autocast casts it back to 16 bits for lora_A's matmul): the backward of
      that 16-bit cast makes the fp32 gradient of the dropout's output, and ``native_dropout_backward`` its
      fp32 input gradient beside it, lora_A's saved 16-bit input freed: ``D = 2 x 4 w - I``.

    max(I, 3 out_b w - P, D) per token; P = 0 (no private copy) leaves the 3 out_b w of the gated product
    (simulate: Gemma-2B QLoRA, dropout 0.05, peak at down_proj's lora_A backward; D: FSDP1 LLaMA-Factory,
    Mistral-7B LoRA fp16-mixed, two fp32 14336-wide gradients at down_proj's dropout backward).
    ``out_b``: the product's gradient bytes (:func:`product_grad_bytes`), the linears' output bytes by
    default."""
    out_b = walk.output_bytes if out_b is None else out_b
    private = walk.down_adapter_private
    dropout = walk.down_adapter_dropout - walk.down_adapter_input if walk.down_adapter_dropout else 0.0
    if private <= 0:
        return out_b * 3 * width
    return max(walk.down_adapter_input, out_b * 3 * width - private, dropout)
