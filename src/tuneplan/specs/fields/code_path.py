"""The rows of whose code runs the step: the framework profile, the loss kernel, activation offload,
torch.compile and a classification head."""

from __future__ import annotations

from tuneplan.specs.fields.field import Field, row
from tuneplan.specs.setup import FRAMEWORKS, LOSSES

ROWS: tuple[Field, ...] = (
    row(
        "framework",
        str,
        "hf",
        "whose defaults and code path (default: hf)",
        accepted=FRAMEWORKS,
        flag=("--framework",),
        label="Framework profile",
        widget="dropdown",
        via={"llamafactory": ("finetuning_type", "use_unsloth"), "axolotl": ("adapter", "base_model")},
    ),
    row(
        "loss",
        str,
        None,
        "cross-entropy kernel (default: the profile's)",
        accepted=LOSSES,
        flag=("--loss",),
        label="Loss kernel",
        widget="dropdown",
        via={  # switches that pick a kernel (ingest/common.py KERNEL_SWITCHES)
            "llamafactory": ("enable_liger_kernel",),
            "axolotl": ("liger_fused_linear_cross_entropy", "cut_cross_entropy", "chunked_cross_entropy"),
            "transformers": ("use_liger_kernel",),
        },
    ),
    row(
        "activation_offload",
        bool,
        False,
        "offload saved activations to CPU (torchtune)",
        flag=("--activation-offload/--no-activation-offload",),
        label="Offload activations",
        widget="checkbox",
    ),
    row(
        "compile",
        bool,
        False,
        "torch.compile the layers and the loss",
        flag=("--compile/--no-compile",),
        label="torch.compile",
        widget="checkbox",
        # on-only switches with a note on what is modelled (ingest/common.py KERNEL_SWITCHES)
        via={
            "llamafactory": ("torch_compile",),
            "axolotl": ("torch_compile",),
            "transformers": ("torch_compile",),
        },
    ),
    row(
        "num_labels",
        int,
        None,
        "train a sequence-classification head with N labels (classifiers, reward models)",
        accepted=">= 1",
        flag=("--num-labels",),
        label="Classifier labels",
        widget="textbox",
    ),
)
