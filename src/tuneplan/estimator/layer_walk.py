"""One layer walked the way autograd sees it: a ledger of the tensors each op saves for backward, and the
two primitives every block is made of, a norm and a linear (with its LoRA adapter).

``torch.autograd`` saves an operand only when the other operand needs a gradient:
- a Linear keeps its input when its weight trains (full / freeze) or a LoRA adapter reads it; modules
  reading the same tensor share one saved copy, unless a dtype cast per module makes a copy each (autocast
  casting an fp32 input, PEFT casting to the fp32 adapter dtype);
- RMSNorm as transformers writes it (``hidden.to(float32)``, ``pow``, ``rsqrt``, ``weight * x``) keeps
  the fp32 input (4h) and, when its weight trains, the normalized output; LayerNorm keeps its input.
"""

from __future__ import annotations

from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.gemma_norm import norm_output_bytes
from tuneplan.estimator.saved_tensors import RSTD_BYTES
from tuneplan.specs.model import LayerSpec, ModelSpec
from tuneplan.specs.setup import TrainSetup


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

    def __init__(self, model: ModelSpec, spec: LayerSpec, setup: TrainSetup, dtypes: Dtypes,
                 targets: frozenset[str],
                 trainable: bool, python_model_code: bool, quant_saves_input: bool, input_requires_grad: bool,
                 litgpt_code: bool, expand_kv: bool) -> None:
        self.model, self.spec, self.setup, self.dtypes, self.targets = model, spec, setup, dtypes, targets
        self.trainable, self.input_requires_grad = trainable, input_requires_grad
        # the tensors of this layer that need no gradient (an op reading only these and frozen weights is not
        # recorded): the normalized input of the first layer LoRA / freeze trains; the attention block adds
        # its output and the MLP's input when no adapter sits on the attention (attention_saved.py)
        self.gradient_free: set[str] = set() if input_requires_grad else {"attn_in"}
        self.python_model_code, self.quant_saves_input = python_model_code, quant_saves_input
        self.litgpt_code, self.expand_kv = litgpt_code, expand_kv
        self.ledger = _Ledger()
        self.fsdp_adapter_input_copy = fsdp1_adapter_input_copy(setup)
        self.pinned_keys: set[str] = set()
        # per token, the adapter-private saved tensors of the MLP's down projection (layer_saved.py)
        self.down_adapter_private = 0.0
        self.down_adapter_input = 0.0  # of which lora_A's saved input (its gradient's size)
        self.down_adapter_dropout = 0.0  # its dropout's backward on the fp32-cast input (layer_saved.py)
        # per token, beside the recomputed 4-bit down projection's dequantized weight (recompute_dequant.py)
        self.recompute_dequant = 0.0
        self.keys_before_down = 0  # the ledger items saved before that down projection
        # per token, the inputs that only a LoRA adapter's lora_A keeps (the frozen base linear does not):
        # released by lora_A's backward like a private copy (layer_saved.down_adapter_backward)
        self.adapter_only_inputs: dict[str, float] = {}
        self.quantized = setup.quant_bits is not None
        self.output_bytes = dtypes.quant_out if self.quantized else dtypes.linear_out
        self.compute_bytes = dtypes.compute
        # CUDA autocast runs layer_norm in fp32 (autocast_mode.cpp fp32 list): a 16-bit input is cast to an
        # fp32 copy, which native_layer_norm saves, and the output is fp32 (RMSNorm code upcasts by hand)
        self.ln_fp32 = dtypes.autocast and model.norm_kind != "rms"
        # the layer's input arrives in fp32: an fp32 residual stream, or, above the bottom layer of a 4-bit
        # model under autocast's fp32 LayerNorm, the layer below's output promoted by its MLP's fp32 output
        # (bitsandbytes returns its input's dtype: layer_saved.feed_forward)
        self.input_fp32 = dtypes.residual == 4 or (self.quantized and self.ln_fp32 and input_requires_grad)
        # bytes per token the first norm keeps that *are* the layer's input (no cast in between): under
        # gradient checkpointing that storage is the checkpoint itself, already counted once
        self.input_alias = 0.0
        # bytes per head and key position of eager attention's saved tensors that its backward releases
        # before softmax's backward (attention_saved.eager_attention)
        self.scores_released = 0.0
        # bytes per element of the scores' gradient from softmax's backward (attention_saved.eager_attention)
        self.scores_grad_bytes = 4.0
        # bytes per token the attention's later nodes saved and release before its scores' backward: the
        # output projection's, the output dropout's mask, probs @ V's V (layer_saved.released_before_scores)
        self.attn_out_saved = 0.0
        # bytes per layer, whatever the tokens: kept for backward / live while the layer is back-propagated
        # (LoRA'd fused expert stacks: layer_saved.fused_stacks_saved)
        self.per_layer = 0.0
        self.backward_per_layer = 0.0
        self.backward_per_layer_per_token = 0.0
        # (bytes per token saved up to and including it, its name, what it reads) at the first LoRA target
        # in forward order: what is left when its adapter starts its backward (layer_saved._with_backward)
        self.first_target: tuple[float, str, str] | None = None
        # the same at the last LoRA target in forward order: the first trained gradient of the layer's
        # backward, where DeepSpeed ZeRO-1/2's first hook allocates its bucket (layer_saved.last_target_terms)
        self.last_target: tuple[float, str, str] | None = None
        # what the layer keeps at those two adapters' backward (layer_saved.first_target_terms /
        # last_target_terms) are rows of the sharded wrappers alone (wrapper_rows.py: ZeRO-1/2's first
        # gradient hook, PEFT's per-adapter FSDP units); other runs leave them (0, 0), not derived
        self.target_moments = bool(setup.zero or setup.fsdp)
        # A trained layer of a freeze fine-tune has fp32 norm weights (upcast like every trainable param) on a
        # 16-bit residual stream: ``weight * x.to(input_dtype)`` promotes the norm output to fp32, so each
        # projection reading it under autocast makes its own 16-bit copy (simulate: Qwen2.5-0.5B freeze).
        norm_output_bytes = dtypes.trainable if (trainable and setup.method == "freeze") else dtypes.norm_out
        if self.ln_fp32:
            norm_output_bytes = 4
        self.inputs_dtype = {"attn_in": norm_output_bytes, "mlp_in": norm_output_bytes,
                             "attn_core": self.compute_bytes, "mlp_mid": self.output_bytes,
                             "q_latent": self.output_bytes, "kv_latent": self.output_bytes}
        # transformers' modeling code applies the config's dropouts; LitGPT's and torchtune's model code has
        # no residual / attention dropout layers (litgpt model.py; torchtune attn_dropout defaults to 0.0)
        self.attention_dropout, self.hidden_dropout, _ = (
            model.dropouts if not (litgpt_code or expand_kv) else (0.0, 0.0, 0.0))

    def norm(self, key: str, width: int, grad_in: bool = True) -> None:
        """RMSNorm as transformers writes it keeps its fp32 input (4 x width) and rstd, and its output when
        its weight trains; compiled, the 16-bit input instead of the fp32 upcast; LayerNorm
        (``native_layer_norm``) keeps its input, mean and rstd, never its output."""
        ledger, dtypes, model = self.ledger, self.dtypes, self.model
        norm_trains = self.trainable
        if not grad_in:
            # The first layer LoRA / freeze trains reads an input that needs no gradient (frozen
            # embeddings below it): autograd keeps nothing for the norm's input path, only what the
            # norm weight's own gradient needs (simulate: layer 0 of a LoRA model saves 16 KiB/token less).
            if norm_trains:
                ledger.save(key + ".out", norm_output_bytes(model, dtypes.norm_out) * width)
            return
        if model.norm_kind == "rms" and self.setup.compile:
            # inductor fuses the norm: its 16-bit input and rstd are kept, the fp32 upcast is recomputed
            ledger.save(key + ".in", dtypes.residual * width)
            if key == "attn_norm":
                self.input_alias = dtypes.residual * width
            ledger.save(key + ".rstd", RSTD_BYTES)
            if norm_trains:
                ledger.save(key + ".out", dtypes.norm_out * width)
        elif model.norm_kind == "rms":
            ledger.save(key + ".fp32_in", 4 * width)
            if key == "attn_norm" and dtypes.residual == 4:  # ``hidden.to(float32)`` returns the input itself
                self.input_alias = 4 * width
            ledger.save(key + ".rstd", RSTD_BYTES)
            if norm_trains:  # Gemma's code keeps it in fp32 (gemma_norm.py)
                ledger.save(key + ".out", norm_output_bytes(model, dtypes.norm_out) * width)
        else:
            # nn.LayerNorm runs aten.native_layer_norm, whose backward computes the weight and bias
            # gradients from the saved input, mean and rstd: the normalized output is not kept, trained
            # weight or not (simulate: GPT-2 full fine-tune, 2 x 4h per token per layer less).
            ledger.save(key + ".in", (4 if self.ln_fp32 else dtypes.residual) * width)
            ledger.save(key + ".stats", 2 * RSTD_BYTES)
            if key == "attn_norm" and (4 if self.ln_fp32 else dtypes.residual) == dtypes.residual:
                self.input_alias = dtypes.residual * width

    def linear(self, m_name: str, reads: str, d_in: int, tokens_share: float = 1.0,
               weight_grad: bool = False) -> None:
        """A Linear keeps its input when its weight trains (or, ``weight_grad``, its weight is a function of
        trained tensors: a LoRA'd fused expert stack), or when a LoRA adapter reads it (x d_in bytes of the
        input's dtype, once per storage); its adapter keeps the r-wide middle (lora_A's output) and, with
        dropout, a mask and its own dropped-out input."""
        ledger, dtypes, compute_bytes = self.ledger, self.dtypes, self.compute_bytes
        targets, trainable = self.targets, self.trainable or weight_grad
        setup, litgpt_code = self.setup, self.litgpt_code
        input_bytes = self.inputs_dtype.get(reads, compute_bytes)
        if litgpt_code and reads == "attn_core" and (trainable or m_name in targets or
                                                       (self.quantized and self.quant_saves_input)):
            # LitGPT: SDPA's output is [B, H, S, D]-contiguous; ``y.transpose(1, 2).reshape(B, T, C)`` copies
            # it, and the projection saves that copy beside the kernel's saved output (litgpt model.py)
            reads = "attn_core_copy"
            self.inputs_dtype[reads] = compute_bytes
        if (self.quantized and self.quant_saves_input and not trainable
                and reads not in self.gradient_free):
            # Linear4bit casts the input to the compute dtype first: the same storage when it already is.
            # A matmul none of whose inputs needs a gradient (the first LoRA layer's frozen input) records
            # no graph node, so nothing keeps its ctx.tensors
            key = reads if input_bytes == compute_bytes else reads + ".q_in"
            ledger.save(key, compute_bytes * d_in * tokens_share)
            self.pinned_keys.add(key)
        # one key per module instance: GPT-2 names both its attention and its MLP output projection c_proj
        module_key = f"{m_name}@{reads}"
        if trainable:
            if dtypes.autocast and input_bytes != compute_bytes:
                ledger.save(f"{module_key}.cast_in", compute_bytes * d_in * tokens_share)
            else:
                ledger.save(reads, input_bytes * d_in * tokens_share)
        elif setup.zero == 3 and not self.quantized and reads not in self.gradient_free:
            # ZeRO-3 (a model built under zero.Init): F.linear is DeepSpeed's LinearFunctionForZeroStage3
            # (runtime/zero/linear.py, setup_context: ctx.save_for_backward(input, weight, bias)), which
            # keeps a frozen linear's input too whenever the op is recorded (some input requires grad)
            ledger.save(reads, input_bytes * d_in * tokens_share)
        if m_name in targets:
            # PEFT casts the adapter input to the adapter dtype; under autocast lora_A then casts it back
            # to 16 bits: a private copy per targeted module. Without a cast the input itself is shared.
            # PEFT's bitsandbytes layers skip that cast under autocast (bnb.py Linear4bit / Linear8bitLt
            # forward: ``requires_conversion = not torch.is_autocast_enabled()``)
            peft_casts = dtypes.adapter != input_bytes and not (self.quantized and dtypes.autocast)
            if self.fsdp_adapter_input_copy or (
                    dtypes.autocast and (peft_casts or input_bytes != compute_bytes)):
                ledger.save(f"{module_key}.lora_in", compute_bytes * d_in * tokens_share)
            elif peft_casts:
                ledger.save(f"{module_key}.lora_in", dtypes.adapter * d_in * tokens_share)
            elif (setup.dropout or 0) > 0:
                # lora_A reads dropout(x), a new tensor: a private copy (LitGPT's fused qkv LoRA runs one
                # dropout for q, k and v together: litgpt lora.py LoRAQKVLinear; a checkpoint's fused
                # gate_up_proj is two LoRALinear modules in LitGPT's LLaMAMLP, fc_1 and fc_2, two dropouts)
                copies = 2 if litgpt_code and m_name.endswith("gate_up_proj") else 1
                ledger.save(f"{self._lora_key(m_name, reads)}.lora_in",
                            copies * input_bytes * d_in * tokens_share)
            else:
                if reads not in ledger.items:  # the frozen base linear kept nothing of it (see above)
                    self.adapter_only_inputs[reads] = input_bytes * d_in * tokens_share
                ledger.save(reads, input_bytes * d_in * tokens_share)
            lora_mid_bytes = compute_bytes if dtypes.autocast else dtypes.adapter
            ledger.save(f"{module_key}.lora_mid", lora_mid_bytes * setup.rank * tokens_share)
            # dropout on an input that needs no gradient (the bottom layer's normalized input) records no
            # node: no mask is kept (simulate: Pythia-6.9B QLoRA, layer 0's query_key_value keeps none)
            if (setup.dropout or 0) > 0 and reads not in self.gradient_free:
                copies = 2 if litgpt_code and m_name.endswith("gate_up_proj") else 1
                ledger.save(f"{self._lora_key(m_name, reads)}.dropout_mask", copies * d_in * tokens_share)
            kept = ledger.total() if self.target_moments else 0.0  # read where target_moments alone
            if self.first_target is None:
                self.first_target = (kept, m_name, reads)
            self.last_target = (kept, m_name, reads)

    def out_bytes(self, reads: str) -> int:
        """Bytes per element of a linear's output when it reads ``reads``: bitsandbytes' Linear4bit casts its
        output back to its input's dtype (``out.to(inp_dtype)``), so an fp32 input (autocast's fp32
        LayerNorm) gives an fp32 output, and a LoRA adapter's 16-bit output added to it is promoted to fp32;
        otherwise the run's linear output dtype."""
        if self.quantized and self.inputs_dtype.get(reads) == 4:
            return 4
        return self.output_bytes

    def _lora_key(self, m_name: str, reads: str) -> str:
        return "qkv_fused" if self.litgpt_code and m_name in self.spec.qkv_names else f"{m_name}@{reads}"


def fsdp1_adapter_input_copy(setup: TrainSetup) -> bool:
    """Whether each LoRA adapter saves a private 16-bit copy of its input under FSDP1 as the HF Trainer
    (and LLaMA-Factory through it) runs it: accelerate upcasts the trainable adapters to fp32 under the
    '-mixed' precisions and PEFT wraps each lora_A in an FSDP unit of its own (wrappers/fsdp.PEFT_UNIT_WRAP)
    whose original parameter, outside that unit's forward, is an fp32 view of its shard
    (``use_orig_params=True``). PEFT's ``_cast_input_dtype(x, lora_A.weight.dtype)`` so casts the 16-bit
    input to fp32, and inside the unit, whose weight is now gathered in the MixedPrecision param dtype,
    autocast casts it back to 16 bits for the matmul (an activation: not cached): a new 16-bit tensor per
    adapter, which lora_A's matmul saves for its weight gradient (simulate: FSDP1, Llama-3.3-70B LoRA on
    q, k, v, o, the cast made in ``lora_A.default._fsdp_wrapped_module``)."""
    if not (setup.fsdp and setup.fsdp_version == 1 and setup.world_size > 1 and setup.method == "lora"):
        return False  # not FSDP1 LoRA: the imports below are for the runs that are
    from tuneplan.estimator.wrappers.fsdp import HF_TRAINER_LOOPS
    from tuneplan.specs.load_precision import fsdp_mixed_precision
    from tuneplan.specs.profiles import get_profile

    return setup.framework in HF_TRAINER_LOOPS and fsdp_mixed_precision(setup, get_profile(setup.framework))
