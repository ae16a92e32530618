"""TrainSetup: how the model is trained. Typed, validated, no formulas.

Field names are those of the field table (specs/fields/). ``validate`` raises a TuneplanError naming the
field and the accepted values for every invalid value or combination; a message that points at another
field names it as ``{field}`` / ``{field=value}``, which each face words its own way (tuneplan.errors).
Defaults that depend on the framework profile (optimizer, attention, targets, checkpointing) are left
as ``None`` here and filled by :func:`tuneplan.specs.profiles.resolve_setup`, which records where each
value came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.specs.limits import MODEL_INT_RANGES, SETUP_INT_RANGES, check_int, check_number, show_value

METHODS = ("full", "freeze", "lora", "qlora")
PRECISIONS = ("fp32", "fp16-mixed", "bf16-mixed", "fp16", "bf16")
OPTIMIZERS = ("adamw", "adamw-fused", "adamw-hf", "adamw-8bit", "paged-adamw-8bit", "paged-adamw",
              "adafactor", "sgd")
ATTENTIONS = ("eager", "sdpa", "flash")
OFFLOADS = ("none", "optimizer", "all")
# Loss kernels: "upcast" = the whole logits tensor upcast to fp32 before cross-entropy (transformers,
# torchtune without chunking); "chunked" = the framework's chunked loss; "fused" = a fused cross-entropy
# kernel on materialised 16-bit logits, gradient written in place (Unsloth's fast_cross_entropy, flash-attn);
# "fused-linear" = the lm_head matmul and the loss fused in token chunks, no logits tensor at all (Liger's
# fused linear cross-entropy, Apple's cut cross-entropy, Unsloth's current default).
LOSSES = ("upcast", "chunked", "fused", "fused-linear")
QUANT_TYPES = ("nf4", "fp4")
FRAMEWORKS = ("hf", "llamafactory", "unsloth", "torchtune", "torchtune-0.2", "litgpt", "fsdp-qlora")
TARGET_SHORTHANDS = ("all-linear", "all", "attn", "mlp")
# transformers' from_pretrained(device_map=...) strategies that split the layers over the cards of one process
# (integrations/accelerate.py _get_device_map): "auto" and "balanced" are the same rule; "none" = no split.
DEVICE_MAPS = ("none", "auto", "balanced", "balanced_low_0", "sequential")
# the frameworks whose training loads the model with a device_map the user chooses: the HF Trainer path.
# LLaMA-Factory's training sets model_args.device_map = {"": get_current_device()} (hparams/parser.py
# get_train_args): one card per process, whatever the config says.
DEVICE_MAP_FRAMEWORKS = ("hf",)


@dataclass(frozen=True)
class TrainSetup:
    method: str = "lora"
    bits: int | None = None  # 4 or 8 for qlora; None = 4 when method is qlora
    quant_type: str = "nf4"
    double_quant: bool = True
    rank: int = 16
    alpha: int | None = None  # default 2*rank (only scales, no memory effect)
    dropout: float | None = None  # None = the profile's default
    targets: str | None = None  # comma list of module names, or a shorthand; None = profile default
    precision: str = "bf16-mixed"
    optimizer: str | None = None
    optimizer_in_backward: bool = False
    batch: int = 1
    seq: int = 512
    grad_accum: int = 1
    gradient_checkpointing: bool | None = None
    attn: str | None = None
    gpus: int = 1  # GPUs per node
    nodes: int = 1
    zero: int = 0
    fsdp: bool = False
    # 1: FullyShardedDataParallel (flat parameters); 2: fully_shard (per-parameter DTensor shards)
    fsdp_version: int = 1
    offload: str = "none"
    framework: str = "hf"
    freeze_trainable_layers: int = 2  # method=freeze: last N layers trainable (LLaMA-Factory default 2)
    # DeepSpeed buckets in elements; None = DeepSpeed's defaults (estimator/wrappers/zero.py). Read from a
    # DeepSpeed JSON by --from ("auto" resolved as the HF integration does: hidden^2, 0.9 hidden^2).
    ds_reduce_bucket: int | None = None
    ds_prefetch_bucket: int | None = None
    # DeepSpeed overlap_comm; None = DeepSpeed's default (on for stage 3 only). ZeRO-1/2 with it on keep a
    # second contiguous-gradients bucket (estimator/wrappers/zero.py). Read from a DeepSpeed JSON by --from.
    ds_overlap_comm: bool | None = None
    loss: str | None = None  # None = the profile's loss kernel (LOSSES)
    # saved activations moved to host memory as they are made, brought back for backward (torchtune
    # enable_activation_offloading); the lm_head / loss stay on the GPU
    activation_offload: bool = False
    # torch.compile of the decoder layers and the loss (torchtune compile=True): inductor's partitioner
    # keeps the inputs of fused element-wise chains and recomputes their insides in backward
    compile: bool = False
    # a sequence-classification head with this many labels instead of the LM head (classifiers, reward
    # models: transformers *ForSequenceClassification); None = causal / masked language modelling
    num_labels: int | None = None
    # naive model parallelism: one process, the layers split over ``gpus`` cards by accelerate's placement
    # rule (from_pretrained(device_map="auto")), one card busy at a time; "none" = each GPU a data-parallel
    # rank
    device_map: str = "none"
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    # Behaviours of older torch stacks that only calibration rows need: not fields of a setup anyone plans
    # (no flag, no widget); specs/torch_era.py TorchEraSetup sets them, the formulas read them from any setup.
    keep_grads = False
    softmax_keeps_input = False
    longest_batch_first = False

    @property
    def world_size(self) -> int:
        """Data-parallel ranks (processes): a device_map run is one process however many cards it spans."""
        return 1 if self.device_map != "none" else self.gpus * self.nodes

    @property
    def cards(self) -> int:
        """GPUs the run holds (and pays for): every rank's card, or every card a device_map spans."""
        return self.gpus * self.nodes

    @property
    def quant_bits(self) -> int | None:
        if self.method != "qlora":
            return None
        return self.bits or 4

    @property
    def is_lora(self) -> bool:
        return self.method in ("lora", "qlora")

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.batch * self.seq

    def replace(self, **changes: Any) -> TrainSetup:
        """``dataclasses.replace``, without re-running ``__init__`` field by field (a new setup is made two or
        three times per estimate): no field has ``init=False`` or a ``__post_init__``, and nothing else lives
        in the instance's ``__dict__``, so a copy of it with the changes is the object ``__init__`` makes."""
        if not changes.keys() <= field_names(type(self)):
            return replace(self, **changes)  # raises dataclasses' TypeError for the unknown name
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__, **changes)
        return new

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("sources", None)
        return d

    def validate(self) -> TrainSetup:
        check_fields({f: getattr(self, f) for f in _CHECKED})
        _choice("method", self.method, METHODS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("framework", self.framework, FRAMEWORKS)
        _choice("offload", self.offload, OFFLOADS)
        _choice("quant_type", self.quant_type, QUANT_TYPES)
        if self.optimizer is not None:
            _choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.attn is not None:
            _choice("attn", self.attn, ATTENTIONS)
        if self.loss is not None:
            _choice("loss", self.loss, LOSSES)
        if self.num_labels is not None and (isinstance(self.num_labels, bool)
                                            or not isinstance(self.num_labels, int)
                                            or self.num_labels < 1):
            raise TuneplanError(f"got {self.num_labels!r}", field="num_labels", accepted="an integer >= 1")
        for name in ("batch", "seq", "grad_accum", "gpus", "nodes"):
            _positive(name, getattr(self, name))
        if self.seq > 4_194_304:
            raise TuneplanError(f"{self.seq} tokens is beyond any model's context", field="seq",
                                accepted="1..4194304")
        if self.bits is not None:
            if self.method != "qlora":
                why = {"lora": f"LoRA on a {self.bits}-bit base is what QLoRA is",
                       "freeze": f"frozen layers could be {self.bits}-bit, but the trained ones cannot take "
                                 "gradients",
                       }.get(self.method, f"full fine-tuning of a {self.bits}-bit model is not possible: "
                                          "its weights cannot take gradients")
                raise TuneplanError(
                    f"quantizing the frozen base to {self.bits} bits only applies to {{method=qlora}} "
                    f"({why})",
                    field="bits", accepted="use {method=qlora}, or leave out {bits}")
            if self.bits not in (4, 8):
                raise TuneplanError(f"got {self.bits}", field="bits", accepted="4, 8")
        if self.is_lora:
            if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
                raise TuneplanError(f"LoRA rank must be a positive integer, got {self.rank!r}", field="rank",
                                    accepted="1, 2, 4, 8, 16, 32, 64, ...")
            if self.rank > 65536:
                raise TuneplanError(f"rank {self.rank} is larger than any layer", field="rank",
                                    accepted="1..65536")
        if self.dropout is not None and not 0.0 <= float(self.dropout) < 1.0:
            raise TuneplanError(f"got {self.dropout}", field="dropout", accepted="0 <= dropout < 1")
        if self.zero not in (0, 1, 2, 3):
            raise TuneplanError(f"got {self.zero}", field="zero", accepted="0, 1, 2, 3")
        if self.fsdp_version not in (1, 2) or isinstance(self.fsdp_version, bool):
            raise TuneplanError(f"got {self.fsdp_version!r}", field="fsdp_version", accepted="1, 2")
        if self.device_map != "none":
            _device_map_combinations(self)
        if self.zero and self.fsdp:
            raise TuneplanError("choose either DeepSpeed ZeRO or FSDP, not both", field="zero",
                                accepted="{zero=0} with {fsdp}, or {zero=N} without {fsdp}")
        if (self.zero or self.fsdp) and self.world_size == 1 and self.offload == "none":
            what = f"ZeRO-{self.zero}" if self.zero else "FSDP"
            raise TuneplanError(
                f"{what} shards across GPUs and needs at least 2 (world size is 1); on one GPU it only "
                "makes sense with CPU offload ({offload=optimizer|all})",
                field="zero" if self.zero else "fsdp", accepted="{gpus=2} or more")
        if self.offload != "none":
            if not (self.zero or self.fsdp):
                raise TuneplanError("CPU offload is a DeepSpeed ZeRO / FSDP feature", field="offload",
                                    accepted="none, or add {zero=2|3} (optimizer) / {zero=3} or {fsdp} (all)")
            if self.offload == "all" and self.zero in (1, 2):
                raise TuneplanError("parameter offload needs ZeRO-3 (or FSDP)", field="offload",
                                    accepted="optimizer with ZeRO-1/2; all with ZeRO-3 or FSDP")
        if self.method == "qlora" and self.precision == "fp32":
            pass  # allowed: compute dtype fp32 (slow but valid)
        if self.ds_overlap_comm is not None and not isinstance(self.ds_overlap_comm, bool):
            raise TuneplanError(f"got {self.ds_overlap_comm!r}", field="ds_overlap_comm",
                                accepted="true, false")
        for name in ("ds_reduce_bucket", "ds_prefetch_bucket"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise TuneplanError(f"must be a positive number of elements, got {v!r}", field=name,
                                    accepted="1, 2, 3, ... (e.g. 500000000)")
        if self.method == "freeze" and self.freeze_trainable_layers <= 0:
            raise TuneplanError("must be positive", field="freeze_trainable_layers", accepted="1..n_layers")
        return self


_CHOICES: dict[str, tuple[str, ...]] = {
    "method": METHODS, "precision": PRECISIONS, "framework": FRAMEWORKS, "offload": OFFLOADS,
    "quant_type": QUANT_TYPES, "optimizer": OPTIMIZERS, "attn": ATTENTIONS, "loss": LOSSES,
    "device_map": DEVICE_MAPS,
}
_BOOLS = ("double_quant", "optimizer_in_backward", "gradient_checkpointing", "fsdp", "ds_overlap_comm",
          "activation_offload", "compile")
_CHECKED = (*_CHOICES, *SETUP_INT_RANGES, *_BOOLS, "bits", "rank", "alpha", "dropout", "zero", "num_labels",
            "ds_reduce_bucket", "ds_prefetch_bucket", "targets", "fsdp_version")
# check_fields' kind of each field checked alike (the others are checked by name)
_KIND = {**{name: "bool" for name in _BOOLS}, **{name: "int" for name in SETUP_INT_RANGES},
         **{name: "choice" for name in _CHOICES}}
# a DeepSpeed bucket of 10^12 elements is 2 TB in bf16: beyond any device (DeepSpeed's default is 5e8)
_MAX_BUCKET = 10**12


def field_names(cls: type) -> frozenset[str]:
    """The dataclass fields of a TrainSetup class (TorchEraSetup adds some), kept per class."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in fields(cls))
    return names


_FIELD_NAMES: dict[type, frozenset[str]] = {}


def check_fields(values: Mapping[str, Any]) -> None:
    """Each given setup field alone: type, finiteness, sign, range (limits.py) or vocabulary.

    The checks that need several fields (ZeRO with one GPU, offload without sharding) are in
    :meth:`TrainSetup.validate`; this runs on the flags as given, before a planner picks the rest.
    """
    for name, value in values.items():
        if value is None:
            continue
        kind = _KIND.get(name, name)  # one look-up per field: a setup has ~30 and every estimate checks it
        if kind == "choice":
            _choice(name, value, _CHOICES[name])
        elif kind == "int":
            low, high, why = SETUP_INT_RANGES[name]
            check_int(name, value, low, high, why)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise TuneplanError(f"got {show_value(value)}", field=name, accepted="true, false")
        elif name == "bits" and (isinstance(value, bool) or value not in (4, 8)):
            raise TuneplanError(f"got {show_value(value)}", field="bits",
                                accepted="4, 8 (bitsandbytes 4-bit or 8-bit)")
        elif name == "rank":
            check_int("rank", value, 1, 65_536, "a LoRA rank above 65536 is wider than any layer")
        elif name == "alpha":
            check_int("alpha", value, 0, 1_048_576, "LoRA scaling numerator, usually 2 x rank")
        elif name == "dropout":
            check_number("dropout", value, 0.0, 1.0, accepted="0 <= dropout < 1")
            if value >= 1.0:
                raise TuneplanError(f"got {value}", field="dropout", accepted="0 <= dropout < 1")
        elif name == "zero" and (isinstance(value, bool) or value not in (0, 1, 2, 3)):
            raise TuneplanError(f"got {show_value(value)}", field="zero", accepted="0, 1, 2, 3")
        elif name == "fsdp_version" and (isinstance(value, bool) or value not in (1, 2)):
            raise TuneplanError(f"got {show_value(value)}", field="fsdp_version", accepted="1, 2")
        elif name == "num_labels":
            check_int("num_labels", value, 1, MODEL_INT_RANGES["vocab_size"][1],
                      "labels of a classifier head")
        elif name in ("ds_reduce_bucket", "ds_prefetch_bucket"):
            check_int(name, value, 1, _MAX_BUCKET, "elements; DeepSpeed's default is 500000000")
        elif name == "targets" and (not isinstance(value, str) or len(value) > 4096):
            raise TuneplanError(f"got {show_value(value)}", field="targets",
                                accepted="a comma list of module names (at most 4096 characters), or "
                                + ", ".join(TARGET_SHORTHANDS))


def _choice(name: str, value: Any, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise TuneplanError(f"unknown value {show_value(value)}", field=name, accepted=accepted)


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise TuneplanError(f"must be a positive integer, got {value!r}", field=name, accepted="1, 2, 3, ...")


def _device_map_combinations(s: TrainSetup) -> None:
    """A device_map splits one process's model over the cards of one machine: no data-parallel wrapper, no
    second node, and only where transformers builds the model (transformers refuses ZeRO-3 with a device_map:
    integrations/accelerate.py; HF Trainer does not wrap a model that spans several cards in DDP)."""
    how = "{device_map} splits the layers over the cards of one process"
    if s.zero:
        raise TuneplanError(f"{how}; DeepSpeed ZeRO shards over one process per card: choose one",
                            field="device_map", accepted="{device_map=none} with {zero}, or {zero=0}")
    if s.fsdp:
        raise TuneplanError(f"{how}; FSDP shards over one process per card: choose one",
                            field="device_map", accepted="{device_map=none} with {fsdp}, or leave out {fsdp}")
    if s.nodes > 1:
        raise TuneplanError("{device_map} splits the layers over the cards of one machine; several nodes "
                            "mean data-parallel ranks (DDP)",
                            field="device_map", accepted="{nodes=1} with {device_map}, or {device_map=none}")
    if s.framework not in DEVICE_MAP_FRAMEWORKS:
        why = ("LLaMA-Factory's training loads the model on each process's own card"
               if s.framework == "llamafactory"
               else f"the {s.framework} profile builds its model another way")
        raise TuneplanError(f"{how}, as transformers' from_pretrained does; {why}", field="device_map",
                            accepted="{framework=hf}, or {device_map=none}")
