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
bytes per token (../shared/reference/prior-art.md e.4), which the tests rederive by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.estimator.dtypes import Dtypes
from tuneplan.specs.model import LayerSpec, ModelSpec
from tuneplan.specs.setup import TrainSetup

LSE_BYTES = 4  # flash / memory-efficient kernels keep an fp32 log-sum-exp per head per token
EAGER_SCORE_BYTES = 6  # eager keeps softmax output in fp32 (4) and its 16-bit cast for matmul (2)
PYTHON_GELU = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh_py")  # transformers NewGELUActivation etc.


class _Ledger:
    """Saved tensors keyed by storage: the same key counts once."""

    def __init__(self) -> None:
        self.items: dict[str, float] = {}

    def save(self, key: str, nbytes: float) -> None:
        self.items[key] = max(self.items.get(key, 0.0), nbytes)

    def total(self) -> float:
        return sum(self.items.values())


@dataclass(frozen=True)
class LayerActs:
    per_token: float  # bytes per token kept by one layer (O(s) part)
    per_token_per_pos: float  # eager attention: bytes per token per key position (x s)
    backward_temp: float  # bytes per token of activation gradients while back-propagating this layer
    backward_temp_per_pos: float


def _saves_input(name: str, trainable: bool, targets: frozenset[str]) -> bool:
    return trainable or name in targets


def layer_activations(
    model: ModelSpec, spec: LayerSpec, setup: TrainSetup, dt: Dtypes, targets: frozenset[str],
    trainable: bool, attn: str, python_model_code: bool, quant_saves_input: bool = False,
) -> LayerActs:
    h = model.hidden
    led = _Ledger()
    quantized = setup.quant_bits is not None
    out_b = dt.quant_out if quantized else dt.linear_out
    c = dt.compute
    r = setup.rank
    norm_trains = trainable

    def norm(key: str, width: int) -> None:
        if model.norm_kind == "rms":
            led.save(key + ".fp32_in", 4 * width)
            if norm_trains:
                led.save(key + ".out", dt.norm_out * width)
        else:
            led.save(key + ".in", dt.residual * width)
            if norm_trains:
                led.save(key + ".out", dt.norm_out * width)

    inputs_dtype = {"attn_in": dt.norm_out, "mlp_in": dt.norm_out, "attn_core": c, "mlp_mid": out_b,
                    "q_latent": out_b, "kv_latent": out_b}

    def linear(m_name: str, reads: str, d_in: int, tokens_share: float = 1.0) -> None:
        in_b = inputs_dtype.get(reads, c)
        if quantized and quant_saves_input and not trainable:
            led.save(reads + ".q_in", in_b * d_in * tokens_share)
        if trainable:
            if dt.autocast and in_b != c:
                led.save(f"{m_name}.cast_in", c * d_in * tokens_share)
            else:
                led.save(reads, in_b * d_in * tokens_share)
        if m_name in targets:
            # PEFT casts the adapter input to the adapter dtype; under autocast lora_A then casts it back
            # to 16 bits: a private copy per targeted module. Without a cast the input itself is shared.
            if dt.autocast and (dt.adapter != in_b or in_b != c):
                led.save(f"{m_name}.lora_in", c * d_in * tokens_share)
            elif dt.adapter != in_b:
                led.save(f"{m_name}.lora_in", dt.adapter * d_in * tokens_share)
            else:
                led.save(reads, in_b * d_in * tokens_share)
            led.save(f"{m_name}.lora_mid", (c if dt.autocast else dt.adapter) * r * tokens_share)
            if (setup.dropout or 0) > 0:
                led.save(f"{m_name}.dropout_mask", 1 * d_in * tokens_share)

    # ---- attention ---------------------------------------------------------------------------
    norm("attn_norm", h)
    for m in spec.linears:
        if m.role == "attn" and m.reads != "attn_core":
            linear(m.name, m.reads, m.d_in)
    a, d, dv = model.n_heads, model.head_dim, model.v_head_dim
    kv_heads = model.n_kv_heads
    if model.mla_kv_lora_rank:
        led.save("kv_latent_norm", 4 * model.mla_kv_lora_rank)
        kv_heads = a  # kv_b_proj expands the latent to every head
    per_pos = 0.0
    if attn == "eager":
        kv_saved = a  # repeat_kv before the matmuls
        led.save("q_attn", c * a * d)
        led.save("k_attn", c * kv_saved * d)
        led.save("v_attn", c * kv_saved * dv)
        per_pos = EAGER_SCORE_BYTES * a
    else:
        kv_saved = kv_heads if attn == "flash" else a
        led.save("q_attn", c * a * d)
        led.save("k_attn", c * kv_saved * d)
        led.save("v_attn", c * kv_saved * dv)
        led.save("attn_out_kernel", c * a * dv)
        led.save("lse", LSE_BYTES * a)
    for m in spec.linears:
        if m.reads == "attn_core":
            linear(m.name, "attn_core", m.d_in)

    # ---- MLP / MoE ------------------------------------------------------------------------------
    if spec.n_norms >= 1 and not (model.family == "gpt" and spec.n_norms == 1):
        norm("mlp_norm", h)
    elif spec.n_norms == 1:
        pass  # parallel attention + MLP read the same normalized input
    mlp = [m for m in spec.linears if m.role in ("mlp", "shared_expert")]
    experts = [m for m in spec.linears if m.role == "expert"]
    routers = [m for m in spec.linears if m.role == "router"]
    for m in routers:
        linear(m.name, m.reads, m.d_in)
        led.save(m.name + ".probs_fp32", 4 * m.d_out)  # softmax over experts in fp32
    hidden_act = str(model.config.get("hidden_act", model.config.get("activation_function", "")))

    def mlp_block(mods: list, width: int, share: float, prefix: str) -> None:
        if not mods:
            return
        for m in mods:
            if m.reads == "mlp_in":
                linear(m.name, "mlp_in" if share == 1.0 else prefix + "gathered", m.d_in, share)
        if model.mlp_kind == "swiglu":
            led.save(prefix + "gate_out", out_b * width * share)
            led.save(prefix + "silu_out", out_b * width * share)
            led.save(prefix + "up_out", out_b * width * share)
        else:
            led.save(prefix + "fc1_out", out_b * width * share)
            if python_model_code and hidden_act in PYTHON_GELU:
                led.save(prefix + "gelu_parts", 3 * out_b * width * share)
        for m in mods:
            if m.reads == "mlp_mid":
                key_in = prefix + "mid"
                inputs_dtype[key_in] = out_b
                linear(m.name, key_in, m.d_in, share)

    if experts:
        k = spec.top_k
        # Each routed copy of a token is gathered (index_select) before the expert matmuls.
        if trainable or any(m.name in targets for m in experts):
            led.save("expert_gathered", c * h * k)
        mlp_block(experts, spec.expert_intermediate, float(k), "expert.")
        led.save("expert_weighted_out", out_b * h * k)
        shared = [m for m in mlp if m.role == "shared_expert"]
        mlp_block(shared, spec.mlp_intermediate, 1.0, "shared.")
    else:
        width = spec.mlp_intermediate or model.intermediate
        mlp_block(mlp, width, 1.0, "mlp.")

    for i in range(max(spec.n_norms - 2, 0)):  # Gemma 2/3, GLM-4: post-attention / post-MLP norms
        norm(f"post_norm{i}", h)

    # Activation gradients while this layer is back-propagated: the gradient of the layer output and
    # of the widest intermediate pair (gate/up) alive together, in the activation dtype.
    width = max(spec.mlp_intermediate, spec.expert_intermediate * max(spec.top_k, 1), 1)
    bwd = out_b * (3 * width + 4 * h)
    bwd_pos = (8.0 * a) if attn == "eager" else 0.0  # grad of fp32 probs and of the scores
    return LayerActs(per_token=led.total(), per_token_per_pos=per_pos, backward_temp=bwd,
                     backward_temp_per_pos=bwd_pos)


@dataclass(frozen=True)
class ActivationPlan:
    saved_bytes: int  # all saved activations at the end of forward (layers + embedding/final norm)
    top_layer_bytes: int  # one layer's saved activations (the one recomputed / freed first)
    checkpoint_bytes: int  # layer inputs kept under gradient checkpointing (0 otherwise)
    recompute_bytes: int  # one layer's activations rebuilt during backward under checkpointing
    backward_temp_bytes: int
    offloaded_bytes: int = 0  # checkpoints moved to host memory (Unsloth)


def activation_plan(model: ModelSpec, setup: TrainSetup, dt: Dtypes, targets: frozenset[str], attn: str,
                    gc_offload: bool, python_model_code: bool, quant_saves_input: bool = False) -> ActivationPlan:
    tokens = setup.batch * setup.seq
    s = setup.seq
    h = model.hidden
    total = 0.0
    biggest = 0.0
    biggest_bwd = 0.0
    layer_no = 0
    first_trainable = model.n_layers - setup.freeze_trainable_layers if setup.method == "freeze" else 0
    for spec, count in model.layer_groups:
        la_train = la_frozen = None
        for _ in range(count):
            trainable = setup.method == "full" or (setup.method == "freeze" and layer_no >= first_trainable)
            if setup.method == "freeze" and not trainable:
                layer_no += 1
                continue  # nothing upstream needs a gradient: autograd records nothing in these layers
            if trainable:
                la_train = la_train or layer_activations(model, spec, setup, dt, targets, True, attn, python_model_code,
                                                         quant_saves_input)
                la = la_train
            else:
                la_frozen = la_frozen or layer_activations(model, spec, setup, dt, targets, False, attn, python_model_code,
                                                           quant_saves_input)
                la = la_frozen
            per_layer = tokens * la.per_token + tokens * s * la.per_token_per_pos
            total += per_layer
            biggest = max(biggest, per_layer)
            biggest_bwd = max(biggest_bwd, tokens * la.backward_temp + tokens * s * la.backward_temp_per_pos)
            layer_no += 1
    # Outside the layers: the final norm keeps its fp32 input; lm_head keeps its input when it trains.
    tail = tokens * 4 * h
    if setup.method == "full":
        tail += tokens * (dt.compute if dt.autocast else dt.norm_out) * h
    n_active = model.n_layers if setup.method != "freeze" else min(setup.freeze_trainable_layers, model.n_layers)
    if setup.gradient_checkpointing:
        ckpt = tokens * dt.residual * h * n_active
        offloaded = ckpt if gc_offload else 0
        return ActivationPlan(saved_bytes=int(ckpt - offloaded + tail), top_layer_bytes=int(biggest),
                              checkpoint_bytes=int(ckpt - offloaded), recompute_bytes=int(biggest),
                              backward_temp_bytes=int(biggest_bwd), offloaded_bytes=int(offloaded))
    return ActivationPlan(saved_bytes=int(total + tail), top_layer_bytes=int(biggest), checkpoint_bytes=0,
                          recompute_bytes=0, backward_temp_bytes=int(biggest_bwd))
