"""The setup flags every planning command shares, declared once.

``with_setup_options`` appends the flags to a command's signature (typer reads ``__signature__``) and
hands the command one dict, ``setup_kw``, of the flags the user actually gave (so profile defaults can
fill the rest and the output can say where each value came from).
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer

_P = "Setup"  # rich help panel


def _opt(*names: str, help: str) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=_P, show_default=False)


SETUP_OPTIONS: list[tuple[str, Any, Any]] = [
    ("method", str | None, _opt("--method", help="full | freeze | lora | qlora (default: lora)")),
    ("bits", int | None, _opt("--bits", help="4 | 8: quantization of the frozen base (qlora) (default: 4)")),
    ("quant_type", str | None, _opt("--quant-type", help="nf4 | fp4 (default: nf4)")),
    ("double_quant", bool | None, _opt("--double-quant/--no-double-quant", help="nested absmax quantization (default: on)")),
    ("rank", int | None, _opt("--rank", "-r", help="LoRA rank (default: 16)")),
    ("alpha", int | None, _opt("--alpha", help="LoRA alpha (scaling only, no memory effect) (default: 2*rank)")),
    ("dropout", float | None, _opt("--dropout", help="LoRA dropout (default: 0)")),
    ("targets", str | None, _opt("--targets", help="LoRA targets: q_proj,v_proj | attn | mlp | all-linear (default: profile)")),
    ("precision", str | None, _opt("--precision", help="fp32 | fp16-mixed | bf16-mixed | fp16 | bf16 (default: profile)")),
    ("optimizer", str | None, _opt("--optimizer", help="adamw | adamw-fused | adamw-hf | adamw-8bit | paged-adamw-8bit | paged-adamw | adafactor | sgd (default: profile)")),
    ("optimizer_in_backward", bool | None, _opt("--optimizer-in-backward/--no-optimizer-in-backward", help="step each parameter during backward (torchtune)")),
    ("batch", int | None, _opt("--batch", "-b", help="micro-batch per GPU (default: 1)")),
    ("seq", int | None, _opt("--seq", "--cutoff-len", "-s", help="tokens per sample (cutoff_len) (default: 512)")),
    ("grad_accum", int | None, _opt("--grad-accum", help="gradient accumulation steps (default: 1)")),
    ("gradient_checkpointing", bool | None, _opt("--gradient-checkpointing/--no-gradient-checkpointing", help="recompute activations in backward instead of keeping them (default: profile)")),
    ("attn", str | None, _opt("--attn", help="eager | sdpa | flash (default: profile)")),
    ("loss", str | None, _opt("--loss", help="upcast | chunked | fused | fused-linear (Liger/CCE): cross-entropy kernel (default: profile)")),
    ("num_labels", int | None, _opt("--num-labels", help="train a sequence-classification head with N labels (classifiers, reward models)")),
    ("keep_grads", bool | None, _opt("--keep-grads/--no-keep-grads", help="zero_grad keeps the gradient buffers (torch < 2.0 default)")),
    ("softmax_keeps_input", bool | None, _opt("--softmax-keeps-input/--no-softmax-keeps-input", help="softmax / log_softmax keep their input for backward (torch < 1.11)")),
    ("compile", bool | None, _opt("--compile/--no-compile", help="torch.compile the layers and the loss")),
    ("activation_offload", bool | None, _opt("--activation-offload/--no-activation-offload", help="offload saved activations to CPU (torchtune)")),
    ("gpus", int | None, _opt("--gpus", help="GPUs per node (default: 1)")),
    ("nodes", int | None, _opt("--nodes", help="nodes (default: 1)")),
    ("zero", int | None, _opt("--zero", help="DeepSpeed ZeRO stage 0|1|2|3 (default: 0)")),
    ("fsdp", bool | None, _opt("--fsdp/--no-fsdp", help="PyTorch FSDP full shard")),
    ("offload", str | None, _opt("--offload", help="none | optimizer | all (default: none)")),
    ("framework", str | None, _opt("--framework", help="hf | llamafactory | unsloth | torchtune | torchtune-0.2 | litgpt (default: hf)")),
]


def with_setup_options(func: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(func)
    # Resolve string annotations (``from __future__ import annotations``) in the command's own module,
    # since typer would otherwise evaluate them in this module's namespace.
    hints = typing.get_type_hints(func, include_extras=True)
    params = [p.replace(annotation=hints.get(p.name, p.annotation))
              for p in sig.parameters.values() if p.name != "setup_kw"]
    for name, ann, default in SETUP_OPTIONS:
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=Annotated[ann, default]))
    # typer wants the default inside Annotated or as the default, not both
    params = [p.replace(default=None) if p.name in {n for n, _, _ in SETUP_OPTIONS} else p for p in params]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        setup_kw = {n: kwargs.pop(n) for n, _, _ in SETUP_OPTIONS if kwargs.get(n) is not None}
        from tuneplan.specs.setup import check_fields

        check_fields(setup_kw)  # each flag alone, at the boundary, before a planner varies the rest
        for n, _, _ in SETUP_OPTIONS:
            kwargs.pop(n, None)
        warn_unused_lora_flags(setup_kw)
        return func(setup_kw=setup_kw, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return wrapper


LORA_ONLY = ("rank", "alpha", "dropout", "targets")


def warn_unused_lora_flags(setup_kw: dict[str, Any]) -> None:
    """``--rank 64 --method full`` says that the LoRA flags are ignored instead of dropping them silently."""
    method = setup_kw.get("method")
    unused = [n for n in LORA_ONLY if n in setup_kw]
    if method in ("full", "freeze") and unused:
        from tuneplan.cli.render import err_console

        flags = ", ".join("--" + n for n in unused)
        verb = "applies" if len(unused) == 1 else "apply"
        err_console.print(f"[yellow]warning:[/] {flags} only {verb} to --method lora or qlora; "
                          f"ignored with --method {method}", highlight=False)
