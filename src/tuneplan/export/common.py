"""What every recipe writer shares: refusals, the header lines, the plain keys.

A writer never computes a number: the header quotes the ``Estimate`` the face made for the plan (model,
setup and GPU), which ``build_export`` is given. A plan the card cannot run (a compatibility error, e.g.
bf16 on a V100) is refused with the finding's fix rather than written out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuneplan import __version__
from tuneplan.errors import TuneplanError
from tuneplan.estimator.types import GIB
from tuneplan.specs import fields as field_table
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.api import Estimate


def refuse_if_cannot_run(est: Estimate) -> None:
    """A compatibility error on the plan's card stops the export (the finding's fix is the way out)."""
    if est.gpu is None:
        return
    errors = [f for f in est.findings if f.level == "error"]
    if errors:
        f = errors[0]
        raise TuneplanError(f"this plan cannot run on {est.gpu.name}: {f.message}", field=f.code,
                            accepted=f.fix)


def header_lines(est: Estimate) -> list[str]:
    """Plain-text lines describing the plan and its estimate (writers add comment markers)."""
    model, s, acc = est.model, est.setup, est.gpu
    what = s.method + (f" {s.quant_bits}-bit {s.quant_type}" if s.method == "qlora" else "") + \
        (f" r={s.rank} targets={s.targets}" if s.is_lora else "") + \
        (f" last {s.freeze_trainable_layers} layers" if s.method == "freeze" else "")
    par = f"{s.gpus} GPU(s) x {s.nodes} node(s)" + (f", ZeRO-{s.zero}" if s.zero else "") + \
        (", FSDP" if s.fsdp else "") + (f", offload {s.offload}" if s.offload != "none" else "") + \
        (f", device_map {s.device_map} (one process)" if s.device_map != "none" else "")
    lines = [
        f"Written by tuneplan {__version__} for {model.name} ({model.params_total / 1e9:.2f}B params).",
        f"Plan: {what}; batch {s.batch} x seq {s.seq}, grad accum {s.grad_accum}; {s.precision}, "
        f"{s.optimizer}, attention {s.attn}, checkpointing {'on' if s.gradient_checkpointing else 'off'}"
        f"{f', loss {s.loss}' if s.loss else ''}{', compiled' if s.compile else ''}; {par}; "
        f"{s.framework} profile.",
    ]
    b = est.breakdown
    peak = (f"Estimated per-GPU peak: {b.device_peak_bytes / GIB:.2f} GiB device "
            f"({b.allocated_peak_bytes / GIB:.2f} GiB allocated)")
    if acc is not None:
        verdict = "fits" if est.fits else "DOES NOT FIT"
        peak += f" on {acc.name} ({acc.memory_bytes / GIB:.2f} GiB): {verdict}"
    lines.append(peak + ".")
    if b.host_bytes:
        lines.append(f"Host memory for offloaded state: {b.host_bytes / GIB:.2f} GiB per GPU.")
    return lines


def launch_line(setup: TrainSetup, program: str) -> str:
    """How to start ``program`` on the planned GPUs (torchrun for one node, per-node torchrun otherwise)."""
    if setup.world_size == 1:
        return program
    nodes = (f" --nnodes {setup.nodes} --node_rank $NODE_RANK --master_addr $MASTER_ADDR"
             if setup.nodes > 1 else "")
    return f"torchrun --nproc_per_node {setup.gpus}{nodes} {program}"


def trainer_kernels(s: TrainSetup, who: str) -> None:
    """Refuse the setup fields a transformers-Trainer run cannot express (the plan would not be the run)."""
    if s.activation_offload:
        raise TuneplanError(f"{who} has no activation offloading", field="activation_offload",
                            accepted="{activation_offload=false}, or a torchtune recipe")
    if s.loss in ("chunked", "fused"):
        raise TuneplanError(f"{who} has no switch for a {s.loss} cross-entropy on materialised logits",
                            field="loss",
                            accepted="{loss=fused-linear} (Liger), {loss=upcast}, or an axolotl / "
                                     "torchtune / Unsloth config")
    if s.keep_grads:
        raise TuneplanError(f"{who} runs on torch >= 2.0, whose zero_grad frees the gradients",
                            field="keep_grads", accepted="{keep_grads=false} to export")
    if s.softmax_keeps_input:
        raise TuneplanError(f"{who} runs on torch >= 2.0, whose softmax keeps only its output",
                            field="softmax_keeps_input", accepted="{softmax_keeps_input=false} to export")
    if s.num_labels:
        raise TuneplanError("the exported recipes train a language model; a sequence-classification head is "
                            "not written", field="num_labels", accepted="leave out {num_labels} to export")


def plain_keys(setup: TrainSetup, fmt: str, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """``{key: value}`` for the plain keys of ``fmt`` (field table, specs/fields/): each field's first name
    with the setup's value, for the fields that apply to the setup's method (``names``: only those, in that
    order). A field left unset (None) is left out: the framework's default is the run's."""
    rows = {f.name: f for f in field_table.plain_fields(fmt, setup.method)}
    out = {}
    for name in names if names is not None else tuple(rows):
        value = getattr(setup, name)
        if name in rows and value is not None:
            out[rows[name].keys[fmt][0]] = value
    return out
