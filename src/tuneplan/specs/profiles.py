"""Framework profiles: what each training stack does by default, as data over one set of formulas.

A profile never forks a formula; it sets the switches the formulas read (dtypes, upcasts, loss kernel,
defaults). Each value cites where it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tuneplan.errors import TuneplanError
from tuneplan.specs.attention_kernels import missing_kernel
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


@dataclass(frozen=True)
class Profile:
    name: str
    label: str
    default_precision: str
    default_optimizer: str
    default_optimizer_qlora: str
    default_attn: str
    # gradient checkpointing default per method
    gc_full: bool
    gc_lora: bool
    gc_qlora: bool
    default_targets: str  # "peft-default" or a shorthand / list
    autocast: bool  # forward under torch.autocast when a 16-bit precision is chosen
    kbit_upcast_fp32: bool  # PEFT prepare_model_for_kbit_training: non-quantized 16-bit params -> fp32
    adapter_fp32: bool  # adapters kept in fp32 (PEFT autocast_adapter_dtype / LLaMA-Factory upcast)
    trainable_fp32_in_mixed: bool  # '-mixed' precisions keep trainable params (master) in fp32
    loss: str  # "hf" (full fp32 upcast), "chunked_bf16" (litgpt), "chunked_fp32" (torchtune), "fused"
    gc_offload: bool = False  # checkpoints offloaded to CPU (Unsloth "smart" GC)
    default_dropout: float = 0.0  # LoRA dropout when the user gives none
    mixed_base_fp32: bool = False  # '-mixed' keeps every parameter (frozen base too) in fp32
    quant_saves_input: bool = False  # 4-bit matmul keeps its input for backward even with a frozen weight
    model_code: str = "hf"  # whose modeling code runs ("hf", "litgpt", "torchtune", "unsloth")
    # FSDP: one unit per block mixes frozen and trainable params (use_orig_params=True), so the unit's flat
    # parameter carries gradients for its frozen weights too (estimator/wrappers/fsdp.py)
    fsdp_mixed_unit_grads: bool = False
    # FSDP: accumulating micro-batches run under no_sync and keep unsharded gradients
    # (estimator/wrappers/fsdp.py)
    fsdp_accumulate_unsharded: bool = False
    # FSDP: ... only with CPU offload (fsdp_qlora train.py: no_sync defaults to False and is forced on for
    # use_cpu_offload with gradient_accumulation_steps > 1; estimator/wrappers/fsdp.py)
    fsdp_accumulate_unsharded_offloaded: bool = False
    # FSDP1 built with use_orig_params=False (flat parameters only; estimator/wrappers/fsdp.py)
    fsdp_flat_params_only: bool = False
    # FSDP1 with limit_all_gathers=True and one unit per LoRA matrix: a layer's all-gathers wait for the
    # compute before them (estimator/collective_time.py gathers_wait_for_compute)
    fsdp_gathers_wait: bool = False
    # FSDP1 MixedPrecision(param_dtype=torch.float32) under the '-mixed' precisions: every unit gathered in
    # fp32 (estimator/wrappers/fsdp.py)
    fsdp_mixed_gathers_fp32: bool = False
    # bytes per weight element live while a quantized linear dequantizes (estimator/quant_kernels.py)
    dequant_bytes_per_elem: float = 0.0
    # the framework's model code always builds a separate lm_head, even for checkpoints that tie it
    unties_embeddings: bool = False
    # FSDP: methods whose recipe leaves the embeddings and lm_head in the root unit (block-wise auto-wrap),
    # which FSDP keeps unsharded from the forward on (estimator/wrappers/fsdp.py)
    fsdp_root_embeddings: tuple[str, ...] = ("full", "freeze", "lora", "qlora")
    # the training loop keeps the last micro-batch's outputs and loss (with its graph) until the next one
    loop_holds_outputs: bool = False
    # ... only through its backward and the optimizer step, dropped before the next forward (fsdp_qlora
    # train.py: output = None after each batch's backward and step; estimator/instants.py)
    loop_holds_outputs_to_step: bool = False
    # the optimizer steps the Trainer's two groups (Trainer.create_optimizer: the weight-decay group, every
    # trainable tensor but biases and norms, then the rest, each in named_parameters() order) rather than
    # model.parameters() as one group (fsdp_qlora train.py, torchtune and LitGPT recipes)
    trainer_param_groups: bool = True
    # every nn.Linear is quantized, the output head included (estimator/weights.param_plan)
    quantizes_lm_head: bool = False
    # ZeRO-3 / FSDP shard the quantization metadata with the weight (torchao NF4Tensor's scalers travel in
    # its FSDP all-gather); bitsandbytes keeps each layer's QuantState on the module, outside the sharded
    # parameter, whole on every rank (bnb nn/modules.py fix_4bit_weight_quant_state_from_module: "the quant
    # state got lost when the parameter got converted. This happens for example for fsdp")
    quant_meta_sharded: bool = False
    # LoRA rank when the user gives none (None: the setup's own default)
    default_rank: int | None = None
    # a pure 16-bit precision still gives the Trainer bf16 / fp16 = True (so accelerate's mixed_precision is
    # not "no"); LLaMA-Factory's pure_bf16 refuses them ("Turn off mixed precision training")
    pure_trainer_amp: bool = False
    sources: tuple[str, ...] = ()


PROFILES: dict[str, Profile] = {
    "hf": Profile(
        name="hf", label="transformers Trainer + PEFT + bitsandbytes",
        default_precision="bf16-mixed", default_optimizer="adamw-fused",
        default_optimizer_qlora="adamw-fused",
        default_attn="sdpa", gc_full=False, gc_lora=False, gc_qlora=True, default_targets="peft-default",
        autocast=True, kbit_upcast_fp32=True, adapter_fp32=True, trainable_fp32_in_mixed=True, loss="hf",
        pure_trainer_amp=True,
        sources=(
            "transformers TrainingArguments: optim defaults to adamw_torch_fused for torch>=2.8; "
            "gradient_checkpointing=False; bf16 -> autocast",
            "peft prepare_model_for_kbit_training: casts fp16/bf16 non-quantized params to fp32 and enables "
            "gradient checkpointing (use_gradient_checkpointing=True)",
            "peft LoraConfig autocast_adapter_dtype=True: adapters in fp32 on a 16-bit base",
            "transformers loss_utils.ForCausalLMLoss: logits.float() before cross_entropy",
            "transformers attn_implementation default 'sdpa' (torch>=2.1.1)",
        ),
    ),
    "llamafactory": Profile(
        name="llamafactory", label="LLaMA-Factory (HF Trainer based)",
        default_precision="bf16-mixed", default_optimizer="adamw-fused",
        default_optimizer_qlora="adamw-fused",
        default_attn="sdpa", gc_full=True, gc_lora=True, gc_qlora=True, default_targets="all",
        autocast=True, kbit_upcast_fp32=False, adapter_fp32=True, trainable_fp32_in_mixed=True, loss="hf",
        sources=(
            "LLaMA-Factory hparams/model_args.py: disable_gradient_checkpointing=False (checkpointing on), "
            "upcast_layernorm=False, upcast_lmhead_output=False",
            "LLaMA-Factory model/adapter.py: trainable params cast to fp32 unless pure_bf16",
            "LLaMA-Factory examples: lora_target: all",
        ),
    ),
    "unsloth": Profile(
        name="unsloth", label="Unsloth (fused loss, offloaded checkpointing, own LoRA kernels)",
        default_precision="bf16-mixed", default_optimizer="adamw-8bit", default_optimizer_qlora="adamw-8bit",
        default_attn="flash", gc_full=True, gc_lora=True, gc_qlora=True, default_targets="all-linear",
        autocast=True, kbit_upcast_fp32=False, adapter_fp32=True, trainable_fp32_in_mixed=True,
        loss="fused_linear",
        gc_offload=True, model_code="unsloth",
        sources=(
            "unsloth README/notebooks: use_gradient_checkpointing='unsloth' (checkpoints offloaded to CPU), "
            "optim='adamw_8bit', target q,k,v,o,gate,up,down",
            "unsloth README (context-length benchmarks): Apple's cut cross-entropy, no logits tensor "
            "(unsloth_zoo fused linear cross-entropy)",
            "unsloth/kernels/fast_lora.py LoRA_QKV / LoRA_W / LoRA_MLP save only X, e, g "
            "(estimator/fused_layers.py)",
        ),
    ),
    "torchtune": Profile(
        name="torchtune", label="torchtune (pure bf16, chunked cross-entropy)",
        default_precision="bf16", default_optimizer="adamw-fused", default_optimizer_qlora="adamw-fused",
        default_attn="sdpa", gc_full=True, gc_lora=True, gc_qlora=True,
        default_targets="q_proj,v_proj,output_proj",
        autocast=False, kbit_upcast_fp32=False, adapter_fp32=False, trainable_fp32_in_mixed=False,
        loss="chunked_fp32", model_code="torchtune", dequant_bytes_per_elem=14.0, trainer_param_groups=False,
        fsdp_root_embeddings=(), quant_meta_sharded=True,
        sources=(
            "torchtune recipes configs: dtype: bf16, enable_activation_checkpointing: True, "
            "loss: CEWithChunkedOutputLoss (8 chunks, each upcast to fp32)",
            "torchtune lora configs: lora_attn_modules ['q_proj','v_proj','output_proj']",
            "torchao NF4Tensor.get_original_weight (used by torchtune linear_nf4 in forward and backward): "
            "int64 unpack of both 4-bit halves + table lookup + scaling + stack = 14 B per weight element",
            "torchtune 0.3 recipes shard with FSDP2 fully_shard(reshard_after_forward=True) (training/"
            "_distributed.py shard_model); torch's _fsdp_state.py keeps the root unsharded after forward "
            "only when that is left to auto, so the root (embeddings, output) is resharded like every layer",
        ),
    ),
    "litgpt": Profile(
        name="litgpt", label="LitGPT (bf16-true, own model code, chunked lm_head loss)",
        default_precision="bf16", default_optimizer="adamw", default_optimizer_qlora="paged-adamw",
        default_attn="sdpa", gc_full=False, gc_lora=False, gc_qlora=False, default_targets="q_proj,v_proj",
        autocast=False, kbit_upcast_fp32=False, adapter_fp32=False, trainable_fp32_in_mixed=True,
        loss="fabric_chunked", model_code="litgpt", default_dropout=0.05, mixed_base_fp32=True,
        trainer_param_groups=False,
        quant_saves_input=True, fsdp_mixed_unit_grads=True, fsdp_accumulate_unsharded=True,
        unties_embeddings=True, loop_holds_outputs=True, quantizes_lm_head=True, dequant_bytes_per_elem=4.0,
        sources=(
            "litgpt finetune/lora.py: precision bf16-true, lora_query/lora_value True, "
            "chunked_cross_entropy(chunk_size=128), lm_head_chunk_size=128",
            "litgpt --quantize bnb.nf4: bitsandbytes PagedAdamW",
            "litgpt finetune/lora.py: lora_dropout=0.05",
            "Lightning Fabric precision 'bf16-mixed': parameters stay fp32, forward under torch.autocast "
            "(lightning.fabric.plugins.precision.amp); 'bf16-true': parameters in bf16, no autocast",
            "bitsandbytes MatMul4Bit before PR #1270 saved its input A for backward whatever B required "
            "(prior-art notes, e.4); litgpt's 2023-2024 tables ran bnb 0.41-0.43",
            "litgpt finetune/lora.py, full.py: FSDPStrategy(auto_wrap_policy={Block}); Lightning Fabric "
            "FSDPStrategy sets use_orig_params=True (torch>=2.0), so a LoRA Block's flat parameter requires "
            "grad (torch FSDP docs: mixing frozen and non-frozen params gives gradient memory 'equivalent to "
            "not freezing those parameters')",
            "litgpt finetune/*.py: fabric.no_backward_sync(model, enabled=is_accumulating) -> FSDP no_sync: "
            "gradients accumulate unsharded until the step's last micro-batch",
            "litgpt model.py GPT.__init__: lm_head = nn.Linear(n_embd, padded_vocab_size) beside "
            "transformer.wte, never tied; convert_hf_checkpoint copies a tied checkpoint's embedding into "
            "lm_head.weight (Gemma, Llama-3.2 1B/3B)",
            "lightning.fabric HalfPrecision / BitsandbytesPrecision.convert_output: module outputs cast to "
            "the default dtype (fp32), so LitGPT's chunked loss runs on fp32 logits (estimator/logits.py)",
            "litgpt finetune/*.py fit(): `logits` and `loss` stay bound across backward and optimizer.step() "
            "until the next micro-batch rebinds them",
            "bitsandbytes <= 0.43 MatMul4Bit.forward: ctx.tensors = (A, B), a Python attribute backward does "
            "not free: the inputs live as long as the loss's graph",
            "lightning.fabric BitsandbytesPrecision: _convert_layers replaces every torch.nn.Linear not in "
            "ignore_modules (litgpt passes none), the lm_head included; _Linear4bit.quantize casts the "
            "weight to torch.half first, so dequantize_4bit returns fp16 and .to(bfloat16) copies it: "
            "2 + 2 bytes per weight element while a linear runs",
        ),
    ),
}


# torchtune 0.1-0.2 (before pytorch/torchtune#1390, 2024-08-22, which added chunked cross-entropy): the same
# stack with the older recipe loop and loss
PROFILES["torchtune-0.2"] = replace(
    PROFILES["torchtune"], name="torchtune-0.2",
    label="torchtune 0.1-0.2 (fp32 logits, no chunked cross-entropy)",
    loss="torchtune_legacy", loop_holds_outputs=True,
    fsdp_root_embeddings=("full", "freeze", "lora", "qlora"),
    default_dropout=0.05,
    sources=(
        "torchtune 0.1.1 / 0.2.1 modules/transformer.py TransformerDecoder.forward: "
        "output = self.output(h).float()",
        "torchtune 0.1.1 / 0.2.1 recipes/lora_finetune_single_device.py train(): logits = "
        "logits[..., :-1, :].contiguous(); logits = logits.transpose(1, 2); loss = self._loss_fn(logits, "
        "labels); loss.backward(): `logits` stays bound until the next iteration rebinds it",
        "pytorch/torchtune#1390 (2024-08-22): chunked cross-entropy; 'removing logits manipulation'",
        "torchtune 0.1.1 models/llama2/_model_builders.py: lora_dropout=0.05 (configs 0.3 on set 0.0)",
        *PROFILES["torchtune"].sources[1:],
    ),
)


# Answer.AI's fsdp_qlora train.py (github.com/AnswerDotAI/fsdp_qlora, train.py at 05ed9f2, 2024-06-13): its
# own loop around FSDP1, transformers' Llama / Mistral code and PEFT (train_type lora / qlora). What it does
# by default, read from the script (line numbers of that commit):
# - precision "bf16": the model is built and loaded in bf16, no autocast, no MixedPrecision policy (540-553,
#   822-826); the bf16_autocast / fp16_autocast choices load fp32 and autocast (tuneplan's '-mixed');
# - qlora: every nn.Linear of model.model becomes a bitsandbytes Linear4bit(quant_type="nf4",
#   compute_dtype=bf16, quant_storage=bf16), the lm_head skipped (591, 615-616); the Linear4bit default
#   compress_statistics=True is double quantization; no prepare_model_for_kbit_training: the embeddings,
#   norms and lm_head stay bf16 as loaded (load_and_quantize casts every tensor to torch_dtype);
# - FSDP1 FULL_SHARD, use_orig_params=False, limit_all_gathers=True, backward_prefetch left at its default
#   (BACKWARD_PRE), forward_prefetch off, CPUOffload(offload_params=True) when use_cpu_offload,
#   sync_module_states=low_memory (753-766); auto-wrap = LlamaDecoderLayer / MistralDecoderLayer plus every
#   leaf module whose weight requires grad (each LoRA A and B a unit of its own, as PEFT's
#   fsdp_auto_wrap_policy), the decoder layers alone for full fine-tuning (468-503, 734-735);
# - activation checkpointing: apply_activation_checkpointing(checkpoint_wrapper) on every decoder layer,
#   NO_REENTRANT unless --reentrant_checkpointing (777-792);
# - the loss: model(input_ids, labels=...) -> transformers' causal-LM loss; the loop drops output and loss
#   after the optimizer step (925-926);
# - optimizer torch.optim.AdamW (foreach, not fused; 459-461); LoRA r=64, alpha=16, dropout 0.1, targets
#   "all" = k,q,v,up,down,gate (no o_proj) (1058-1061, 1158-1159).
PROFILES["fsdp-qlora"] = Profile(
    name="fsdp-qlora", label="Answer.AI fsdp_qlora train.py (FSDP1, pure bf16, bnb 4-bit in bf16 storage)",
    default_precision="bf16", default_optimizer="adamw", default_optimizer_qlora="adamw",
    default_attn="sdpa", gc_full=True, gc_lora=True, gc_qlora=True,
    default_targets="k_proj,q_proj,v_proj,up_proj,down_proj,gate_proj",
    autocast=False, kbit_upcast_fp32=False, adapter_fp32=False, trainable_fp32_in_mixed=True,
    mixed_base_fp32=True, loss="torchtune_legacy", default_dropout=0.1, default_rank=64,
    fsdp_flat_params_only=True, fsdp_gathers_wait=True, fsdp_mixed_gathers_fp32=True,
    fsdp_accumulate_unsharded_offloaded=True, loop_holds_outputs_to_step=True, trainer_param_groups=False,
    sources=(
        "fsdp_qlora train.py fsdp_qlora(): precision='bf16' (torch_dtype bf16, no autocast, mp_policy None); "
        "bf16_autocast / fp16_autocast load fp32 and run under torch.cuda.amp.autocast",
        "fsdp_qlora train.py: use_gradient_checkpointing=True (checkpoint_wrapper on LlamaDecoderLayer / "
        "MistralDecoderLayer), reentrant_checkpointing=False",
        "fsdp_qlora train.py get_optimizer: optimizer='adamw' -> torch.optim.AdamW(fused=False)",
        "fsdp_qlora train.py: lora_rank=64, lora_alpha=16, lora_dropout=0.1, lora_target_modules='all' -> "
        "['k_proj','q_proj','v_proj','up_proj','down_proj','gate_proj']",
        "fsdp_qlora train.py: replace_linear(model.model, Linear4bit, quant_type='nf4', "
        "quant_storage=torch_dtype, skip_modules=['lm_head']); no prepare_model_for_kbit_training",
        "fsdp_qlora train.py: attn_impl='sdpa'",
        "PEFT < 0.11 (the 2024 stack of Answer.AI's measurements) gives adapters the dtype of the base "
        "layer's weight (bf16, Params4bit in bf16 quant_storage); PEFT >= 0.11 upcasts them to fp32 "
        "(huggingface/peft#1706, autocast_adapter_dtype)",
        "transformers 4.37-4.45 LlamaForCausalLM / MistralForCausalLM.forward: logits = logits.float(); "
        "shift_logits = logits[..., :-1, :].contiguous(): the fp32 logits (kept in the output through "
        "backward) and a contiguous fp32 shifted copy, the chain of the 'torchtune_legacy' loss; train.py "
        "sets output = None after the step, so nothing is held into the next forward",
        "fsdp_qlora train.py FSDP(...): ShardingStrategy.FULL_SHARD, use_orig_params=False, "
        "limit_all_gathers=True, BackwardPrefetch default (BACKWARD_PRE), CPUOffload(offload_params=True) "
        "when use_cpu_offload; auto-wrap _or_policy(decoder layers, leaf modules with a trainable weight)",
        "fsdp_qlora train.py fsdp_qlora(): no_sync=False by default, set True when use_cpu_offload and "
        "gradient_accumulation_steps > 1; fsdp_main runs an accumulating batch under model.no_sync() only "
        "when args['no_sync']",
    ),
)


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise TuneplanError(f"unknown framework {name!r}", field="framework",
                            accepted=tuple(PROFILES)) from None


def classifier_head_params(model: ModelSpec, num_labels: int) -> int:
    """transformers' sequence-classification head: a ``score`` Linear (hidden x labels, no bias) on decoders,
    BERT's ``classifier`` (hidden x labels + bias) on encoders."""
    return model.hidden * num_labels + (num_labels if model.architecture == "encoder" else 0)


def model_as_built(model: ModelSpec, framework: str, num_labels: int | None = None) -> ModelSpec:
    """The model as the framework's own code instantiates it (LitGPT: a tied checkpoint gets its own lm_head),
    with a sequence-classification head when ``num_labels`` is given: transformers' *ForSequenceClassification
    replaces the LM head by a ``score`` Linear (hidden x labels, no bias) on decoders, and BERT's MLM head by
    a pooler (hidden x hidden + bias) and a classifier (hidden x labels + bias)."""
    if model.tied_embeddings and get_profile(framework).unties_embeddings:
        model = replace(model, tied_embeddings=False, lm_head_params=model.vocab * model.hidden)
    if num_labels:
        head = classifier_head_params(model, num_labels)
        if model.architecture == "encoder":
            h = model.hidden
            return replace(model, tied_embeddings=False, lm_head_params=0, head_out=num_labels,
                           other_params=h * h + h + head)
        return replace(model, tied_embeddings=False, lm_head_params=head, head_out=num_labels)
    return model


CHUNKED_LOSSES = ("chunked_bf16", "chunked_fp32", "fabric_chunked")


def loss_kind(setup: TrainSetup, prof: Profile) -> str:
    """The loss kernel estimator/logits.py models: the setup's choice (LOSSES) or the profile's default."""
    kind = prof.loss
    if setup.loss == "upcast":
        kind = "hf"
    elif setup.loss == "chunked":
        kind = prof.loss if prof.loss in CHUNKED_LOSSES else "chunked_fp32"
    elif setup.loss == "fused":
        kind = "fused"
    elif setup.loss == "fused-linear":
        kind = "fused_linear"
    if kind == "chunked_fp32" and setup.compile:
        return "chunked_compiled"  # torchtune compiles compute_cross_entropy: the upcast is fused
    return kind


def peft_default_targets(model: ModelSpec) -> str:
    """PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING, by the modules the model has."""
    names = model.linear_roles.keys()  # the model's linear names
    for pair in (("q_proj", "v_proj"), ("query", "value")):
        if names >= set(pair):
            return ",".join(pair)
    for fused in ("qkv_proj", "query_key_value", "c_attn", "wqkv"):
        if fused in names:
            return fused
    return "attn"


def resolve_setup(setup: TrainSetup, model: ModelSpec, explicit: frozenset[str] = frozenset(),
                  supports_bf16: bool | None = None) -> TrainSetup:
    """Fill profile defaults into the fields left as None; record each value's origin in ``sources``.

    ``explicit`` names the fields the user set (flags or a config file already recorded there). The setup
    is validated here, once, before any default is read from it; what is filled in is a profile's own
    value (a test checks each profile's defaults pass ``TrainSetup.validate``), so the result needs no
    second check.
    """
    setup.validate()
    prof = get_profile(setup.framework)
    sources = dict(setup.sources)
    changes: dict[str, object] = {}

    def default(field: str, value: object) -> None:
        changes[field] = value
        sources[field] = f"{prof.name} profile default"

    if setup.method == "qlora" and setup.bits is None:
        default("bits", 4)
    if (prof.default_rank and "rank" not in explicit and "rank" not in sources
            and setup.rank == TrainSetup.rank):
        default("rank", prof.default_rank)
    if setup.dropout is None:
        default("dropout", prof.default_dropout if setup.is_lora else 0.0)
    if setup.optimizer is None:
        default("optimizer",
                prof.default_optimizer_qlora if setup.method == "qlora" else prof.default_optimizer)
    if setup.attn is None and setup.softmax_keeps_input:
        changes["attn"] = "eager"
        sources["attn"] = "eager: torch < 1.11 (softmax_keeps_input) has no SDPA or FlashAttention-2"
    elif setup.attn is None and prof.model_code == "hf" and prof.default_attn == "sdpa" and (
            why := missing_kernel(model.model_type, "sdpa")):
        changes["attn"] = "eager"
        sources["attn"] = (f"eager: transformers' default for {model.model_type}, which has no SDPA path "
                           f"({why})")
    elif setup.attn is None:
        default("attn", prof.default_attn)
    if setup.gradient_checkpointing is None:
        gc = {"full": prof.gc_full, "freeze": prof.gc_full, "lora": prof.gc_lora, "qlora": prof.gc_qlora}
        default("gradient_checkpointing", gc[setup.method])
    if setup.targets is None and setup.is_lora:
        t = prof.default_targets
        default("targets", peft_default_targets(model) if t == "peft-default" else t)
    if "precision" not in explicit and "precision" not in sources and setup.precision == "bf16-mixed":
        if prof.default_precision != setup.precision:
            default("precision", prof.default_precision)
    prec = changes.get("precision", setup.precision)
    if supports_bf16 is False and "precision" not in explicit and str(prec).startswith("bf16"):
        # The profile's bf16 default cannot run on this card (compute capability < 8.0): a user of the
        # framework would set fp16 with loss scaling instead.
        changes["precision"] = str(prec).replace("bf16", "fp16")
        sources["precision"] = f"{prof.name} profile default (fp16: this GPU has no bf16)"
    for f in explicit:
        sources.setdefault(f, "flag")
    return setup.replace(**changes, sources=sources) if changes or sources != setup.sources else setup
