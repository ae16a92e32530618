"""The rows of one optimizer step's shape: micro-batch, tokens per sample, accumulation, checkpointing,
attention."""

from __future__ import annotations

from tuneplan.specs.fields.field import Field, row
from tuneplan.specs.setup import ATTENTIONS

ROWS: tuple[Field, ...] = (
    row(
        "batch",
        int,
        1,
        "micro-batch per GPU (default: 1)",
        accepted=">= 1",
        unit="sequences",
        flag=("--batch", "-b"),
        label="Micro-batch per GPU",
        widget="number",
        keys={
            "llamafactory": ("per_device_train_batch_size",),
            "axolotl": ("micro_batch_size",),
            "transformers": ("per_device_train_batch_size",),
            "deepspeed": ("train_micro_batch_size_per_gpu",),
        },
    ),
    row(
        "seq",
        int,
        512,
        "tokens per sample (default: 512)",
        accepted="1..4194304",
        unit="tokens",
        flag=("--seq", "--cutoff-len", "-s"),
        label="Tokens per sample (cutoff_len)",
        widget="number",
        keys={
            "llamafactory": ("cutoff_len",),
            "axolotl": ("sequence_len",),
            # TRL SFTConfig: max_length since TRL 0.20, max_seq_length before
            "transformers": ("max_length", "max_seq_length"),
        },
    ),
    row(
        "grad_accum",
        int,
        1,
        "gradient accumulation steps (default: 1)",
        accepted=">= 1",
        unit="steps",
        flag=("--grad-accum",),
        label="Grad. accumulation",
        widget="number",
        keys={
            "llamafactory": ("gradient_accumulation_steps",),
            "axolotl": ("gradient_accumulation_steps",),
            "transformers": ("gradient_accumulation_steps",),
            "deepspeed": ("gradient_accumulation_steps",),
        },
        via={"accelerate": ("deepspeed_config",)},
    ),
    row(
        "gradient_checkpointing",
        bool,
        None,
        "recompute activations in backward instead of keeping them (default: the profile's)",
        flag=("--gradient-checkpointing/--no-gradient-checkpointing",),
        label="Gradient checkpointing",
        widget="dropdown",
        keys={"transformers": ("gradient_checkpointing", "activation_checkpointing")},
        via={
            "llamafactory": ("disable_gradient_checkpointing",),
            "axolotl": ("gradient_checkpointing", "fsdp_config"),
            "accelerate": ("fsdp_config",),
        },
    ),
    row(
        "attn",
        str,
        None,
        "attention kernel (default: the profile's)",
        accepted=ATTENTIONS,
        flag=("--attn",),
        label="Attention",
        widget="dropdown",
        via={
            "llamafactory": ("flash_attn",),
            "axolotl": ("flash_attention", "sdp_attention", "eager_attention"),
            "transformers": ("attn_implementation",),
        },
    ),
)
