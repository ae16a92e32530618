"""The terms of the step time that depend on neither the micro-batch, the sequence length nor the
accumulation, computed once per (run, card, options): the card's rates, the FLOP plan, launches, the
optimizer update, the collectives (``collective_time.py``) and the host-link copies (``throughput.py`` turns
them into seconds per step for a shape)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from tuneplan.estimator.card_rates import (
    BW_EFFICIENCY,
    FUSED_OPS,
    FUSED_TRAFFIC,
    GEMM_EFFICIENCY,
    card_class,
    matmul_peak_tflops,
)
from tuneplan.estimator.collective_time import collective_terms, corrected_link
from tuneplan.estimator.compute import FlopPlan, flop_plan
from tuneplan.estimator.dequant_time import dequant_bytes_per_weight, dequant_library, kernels_per_dequant
from tuneplan.estimator.gemm_efficiency import CardEfficiency, card_efficiency, unverified_figures
from tuneplan.estimator.launch_costs import (
    DISPATCH_SECONDS,
    MICRO_BATCH_FIXED_SECONDS,
    OP_DISPATCH_SECONDS,
    fsdp_unit_ops,
    optimizer_ops,
)
from tuneplan.estimator.links import Link, host_link
from tuneplan.estimator.logits import LITGPT_CHUNK
from tuneplan.estimator.wrappers.fsdp import frozen_weights_get_gradients
from tuneplan.specs.hardware import Accelerator

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run

# CPU optimizer step under offload (DeepSpeed CPUAdam, FSDP CPUOffload's torch Adam on the CPU): a
# streaming update, bound by host memory. Adam over fp32 master weights reads weight, gradient, m and v
# (16 B) and writes weight, m and v (12 B) plus the 16-bit copy sent back (2 B): 30 B per parameter.
# A two-socket server streams ~200-300 GB/s (STREAM on 8-12 DDR4/DDR5 channels per socket) shared by up
# to 8 GPUs' ranks and by the PCIe copies themselves: 20 GB/s per GPU is an assumption, stated in the output.
HOST_ADAM_BYTES_PER_PARAM = 30.0
HOST_MEMORY_GBS_PER_GPU = 20.0


class UnknownThroughput(ValueError):
    """The card lacks a figure the time model needs (its tensor peak or memory bandwidth)."""


@dataclass(frozen=True)
class RuntimeOptions:
    compiled: bool = False  # torch.compile / fused kernels (torchtune compile=True, Unsloth)
    inter_node_gbs: float | None = None  # per-GPU network bandwidth between nodes, GB/s (default: links.py)
    peak_tflops: float | None = None  # override the catalog's dense tensor peak for the matmul dtype
    gemm_efficiency: float | None = None  # override the card-class GEMM efficiency
    peer_link: str | None = None  # the link between the GPUs of a node as stated (links.stated_link)
    # time factors per mechanism measured on this machine (estimator/step_calibration.py): compute scales
    # the GEMM rate, memory_bound the memory bandwidth, communication the GPU link, offload the host link
    # and the CPU optimizer, overhead the CPU cost per launch / per unit / per micro-batch
    corrections: tuple[tuple[str, float], ...] = ()


@dataclass
class TimeStatics:
    """The terms of the step time that depend on neither the micro-batch, the sequence length nor the
    accumulation: rates of the card, FLOP coefficients, launches, the optimizer update, the collectives'
    volumes and the host-link copies. Computed once per (run, card, options) by :func:`time_statics`.
    Read-only by convention, not frozen (as ``memory_statics.MemoryStatics``: cheaper to make)."""

    peak: float
    u: float
    cls: str
    dev_bw: float
    bw: float
    fused: bool
    flops: FlopPlan
    passes: int  # weight reads per micro-batch: forward, backward, recompute
    weight_bytes: int
    grad_bytes: int  # bytes of the gradients the backward makes (read and written): trainable params, and
    #                  the frozen block weights where they get gradients (frozen_weights_get_gradients)
    traffic_factor: float
    gemm_launch: float  # matmul kernels x launch time
    other_launch: float
    other_kernels: float
    dequant_s: float  # the block linears' rebuilds per micro-batch (a chunked quantized head: per shape)
    dequant_part: float
    dequant_library: str
    dequant_s_per_elem: float
    launch: float  # seconds per counted kernel
    launch_s: float  # every launch of one micro-batch
    unit_s: float
    optimizer_s: float
    optimizer_launch_s: float  # the optimizer's launches beyond its memory time (per-kernel
    # roofline)
    paged: int  # paged optimizer state bytes
    host: Link
    links: dict[str, str]  # intra_node (and inter_node)
    link_gbs: float
    per_micro: float
    gather_s: float  # one all-gather of every sharded parameter (ZeRO-3/FSDP), seconds; 0 unsharded
    gathers_wait: float  # seconds of per_micro no compute hides (collective_time.gathers_wait_for_compute)
    per_step: float
    serial: float
    bucket: float
    offload_step_bytes: float
    offload_micro_bytes: float
    cpu_optimizer_s: float
    assumptions_head: tuple[str, ...]  # collectives, offload
    assumptions_tail: tuple[str, ...]  # rates, fused kernels, eager attention
    fixed_s: float = MICRO_BATCH_FIXED_SECONDS  # fixed cost per micro-batch (calibrated: times its factor)
    card_known: str = "spec-derived"  # how well the card's tensor throughput is known (gemm_efficiency.py)
    link_name: str = ""  # the link the collectives run on
    link_stated: bool = False  # given by the user (--link), not read off the catalog
    # DeepSpeed ZeRO-1/2 offload accumulating over micro-batches: the gradient's round trip through the host
    # (``offload_terms``), bytes per trip, and whether it runs every micro-batch (ZeRO-2) or once per step
    accum_trip_bytes: float = 0.0
    accum_trip_per_micro: bool = False
    accum_add_bytes: float = 0.0  # the GPU's add of the buffer that came up to the new gradient, per trip
    # DeepSpeed ZeRO-1/2's gradient copies on the GPU (``gradient_copy_bytes``), bytes per micro-batch and
    # per step
    grad_copy_micro_bytes: float = 0.0
    grad_copy_step_bytes: float = 0.0
    # FSDP1 with use_orig_params: the units' gradients autograd concatenates into flat gradients, bytes per
    # micro-batch (flat_gradient_bytes)
    flat_grad_bytes: float = 0.0


class CardRates(NamedTuple):
    peak: float  # dense tensor TFLOPS of the matmul dtype
    u: float  # fraction of ``peak`` the GEMMs reach (a calibrated compute factor divides it)
    cls: str
    eff: CardEfficiency
    dev_bw: float  # bytes/s of one device (a calibrated memory factor divides it)
    bw: float  # ``dev_bw`` x ``BW_EFFICIENCY``: what streaming element-wise kernels reach


def card_rates(run: Run, acc: Accelerator, opt: RuntimeOptions, kf: dict[str, float]) -> CardRates:
    """The card's tensor and memory rates for ``run``: ``u = gemm_fraction / k_compute``,
    ``dev_bw = bandwidth / devices_per_package / k_memory``, ``bw = dev_bw x BW_EFFICIENCY``.
    Raises UnknownThroughput when the catalog lacks the peak or the bandwidth."""
    setup = run.setup
    peak = opt.peak_tflops or matmul_peak_tflops(acc, setup)
    if not peak:
        raise UnknownThroughput(f"{acc.name}: the catalog has no dense tensor peak for {setup.precision} "
                                "matmuls (add bf16_tflops_dense / fp32_tflops with {hardware_file})")
    if not acc.memory_bandwidth_gbs:
        raise UnknownThroughput(f"{acc.name}: the catalog has no memory bandwidth "
                                "(add memory_bandwidth_gbs with {hardware_file})")
    cls = card_class(acc)
    eff = card_efficiency(acc, GEMM_EFFICIENCY[cls], unverified_figures(acc) is not None)
    u = (opt.gemm_efficiency or eff.fraction) / kf.get("compute", 1.0)
    dev_bw = acc.memory_bandwidth_gbs * 1e9 / max(1, acc.devices_per_package) / kf.get("memory_bound", 1.0)
    return CardRates(peak, u, cls, eff, dev_bw, dev_bw * BW_EFFICIENCY)


class OptimizerTerms(NamedTuple):
    optimizer_s: float
    optimizer_launch_s: float
    paged: int


def optimizer_terms(run: Run, bw: float, k_over: float) -> OptimizerTerms:
    """The update, once per step: it reads the weights and gradients and writes the weights
    (``3 x trainable bytes`` per parameter) and reads and writes every state (``2 x states``), at ``bw``;
    a sharded optimizer updates ``1/n`` of it. Its launches (``optimizer_ops`` x ``OP_DISPATCH_SECONDS``
    x ``k_overhead``) count only beyond that memory time, and not at all when the states are sharded or
    the step runs on the CPU."""
    setup, pp = run.setup, run.param_plan
    op = run.stepped_optimizer
    states = op.states + op.paged
    upd_bytes: float = (pp.trainable_params * (2 * pp.trainable_bytes + pp.trainable_bytes) + 2 * states
                        + op.temp * 2)
    if run.wrapper.shards_optimizer:
        upd_bytes /= setup.world_size
    optimizer_s = 0.0 if setup.offload != "none" else upd_bytes / bw
    optimizer_launch_s = 0.0
    if setup.offload == "none" and not run.wrapper.shards_optimizer:
        optimizer_launch_s = max(0.0, optimizer_ops(run.optimizer, pp.trainable_tensors) * OP_DISPATCH_SECONDS
                                 * k_over - optimizer_s)
    return OptimizerTerms(optimizer_s, optimizer_launch_s, op.paged)


class OffloadTerms(NamedTuple):
    step_bytes: float
    micro_bytes: float
    cpu_optimizer_s: float
    note: str | None
    accum_trip_bytes: float = 0.0
    accum_trip_per_micro: bool = False
    accum_add_bytes: float = 0.0


def offload_terms(run: Run, kf: dict[str, float]) -> OffloadTerms:
    """CPU offload over the host link (DeepSpeed ZeRO-Offload / FSDP CPUOffload): per step the shard's
    fp32 gradients down and 16-bit parameters up (``trainable / n x (4 + compute bytes)``); with the
    parameters offloaded too, their shard up for forward and backward per micro-batch (``2 x weights /
    n``); the CPU update at ``HOST_ADAM_BYTES_PER_PARAM / HOST_MEMORY_GBS_PER_GPU`` per parameter."""
    setup, pp = run.setup, run.param_plan
    if setup.offload == "none":
        return OffloadTerms(0.0, 0.0, 0.0, None)
    n = setup.world_size
    shard_t = pp.trainable_params / n
    step_bytes = shard_t * (4 + run.dtypes.compute)
    micro_bytes = 2 * (pp.weight_bytes + pp.adapter_bytes) / n if setup.offload == "all" else 0.0
    cpu_optimizer_s = (shard_t * HOST_ADAM_BYTES_PER_PARAM / (HOST_MEMORY_GBS_PER_GPU * 1e9)
                       * kf.get("offload", 1.0))
    note = (f"CPU offload: PCIe copies, and the optimizer step on the CPU at "
            f"{HOST_ADAM_BYTES_PER_PARAM:g} B per parameter of host memory traffic at "
            f"{HOST_MEMORY_GBS_PER_GPU:g} GB/s per GPU ({cpu_optimizer_s:.2f} s per step)")
    # DeepSpeed ZeRO-1/2 with the optimizer on the CPU accumulates the gradients of several micro-batches
    # in a host buffer of the 16-bit parameter dtype (stage_1_and_2.py, async_accumulate_grad_in_cpu_via_gpu,
    # while the default grad_accum_dtype is the model's): the buffer comes up, the new gradient is added
    # on the GPU (reads both, writes one), the sum goes back down. ZeRO-2 reduces (and so does this) at
    # every micro-batch; ZeRO-1 only at the last, where the trip is made once. A lone micro-batch skips it.
    trip = 2 * shard_t * pp.trainable_bytes if setup.zero in (1, 2) else 0.0
    return OffloadTerms(step_bytes, micro_bytes, cpu_optimizer_s, note, trip, setup.zero == 2, 1.5 * trip)


def gradient_copy_bytes(run: Run) -> tuple[float, float]:
    """GPU bytes DeepSpeed ZeRO-1/2 moves to hand the gradients to its optimizer, per micro-batch and per
    step (stage_1_and_2.py with ``contiguous_gradients``, its default): every gradient is copied into the
    reduction bucket (``reduce_independent_p_g_buckets_and_remove_grads``: read + write, ``2 x g``), then
    this rank's shard into the partition's gradient buffer (``copy_grads_in_partition``: ``2 x g / n``);
    with the optimizer on the CPU the shard is instead cast to fp32 on the GPU before it goes down
    (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``: read 16-bit, write 4 B; nothing in fp32), once
    per step. ZeRO-2 reduces at every micro-batch; ZeRO-1 only at the last. The gradient norm (a read)
    is left out here as the plain loop's clipping is."""
    setup, pp = run.setup, run.param_plan
    if setup.zero not in (1, 2):
        return 0.0, 0.0
    n = setup.world_size
    g = pp.trainable_params * pp.trainable_bytes
    bucket = 2.0 * g
    if setup.offload == "none":
        partition, at_step = 2.0 * g / n, 0.0
    else:
        cast = pp.trainable_bytes + 4 if pp.trainable_bytes != 4 else 0
        partition, at_step = 0.0, pp.trainable_params / n * cast
    if setup.zero == 2:
        return bucket + partition, at_step
    return 0.0, bucket + partition + at_step


def flat_gradient_bytes(run: Run) -> float:
    """Bytes of the units' gradients FSDP1 with ``use_orig_params=True`` concatenates into each unit's flat
    gradient per micro-batch. The original parameters are views of the flat parameter
    (``FlatParamHandle._get_unflat_views``: ``torch.split`` then ``view``), and split's backward is a
    ``cat`` of the views' gradients: it reads them and writes the flat gradient. LitGPT's Fabric
    ``FSDPStrategy`` sets ``use_orig_params=True``; the gradients are the trained weights', or with mixed
    frozen / trainable units the whole blocks' (``frozen_weights_get_gradients``). 0 where not known."""
    setup, pp = run.setup, run.param_plan
    if not (setup.fsdp and setup.fsdp_version == 1 and setup.world_size > 1
            and run.profile.fsdp_mixed_unit_grads):
        return 0.0
    trained = pp.trainable_params * pp.trainable_bytes
    if frozen_weights_get_gradients(run):
        return run.model.params_layers * run.dtypes.frozen_weight + trained
    return trained if setup.method == "full" else 0.0


def rate_notes(run: Run, rates: CardRates, fused: bool) -> tuple[str, ...]:
    """The assumptions about rates the output states after the collectives'."""
    tail = [f"matmuls at {rates.u:.0%} of the {rates.peak:g} TFLOPS dense peak ({rates.cls} class; card "
            f"throughput {rates.eff.known}: {rates.eff.source}), element-wise kernels at {BW_EFFICIENCY:.0%} "
            f"of {rates.dev_bw / 1e9:g} GB/s"]
    if fused:
        tail.append("fused kernels (torch.compile / Unsloth): element-wise traffic and launches reduced")
    if run.setup.attn == "eager":
        tail.append("eager attention computes the full s x s scores (no causal skipping)")
    return tuple(tail)


def time_statics(run: Run, acc: Accelerator, opt: RuntimeOptions) -> TimeStatics:
    """The shape-independent terms of ``run`` on ``acc`` (kept on the run for the last card asked about).

    Launches: every counted kernel costs ``DISPATCH_SECONDS x k_overhead`` of CPU time (x ``FUSED_OPS``
    compiled); fused kernels also cut the element-wise kernels and traffic. A sharded unit (FSDP unit /
    ZeRO-3 module, one per decoder layer) adds ``fsdp_unit_ops x OP_DISPATCH_SECONDS`` per micro-batch.
    Dequantization: ``elements x bytes per weight / dev_bw`` per micro-batch."""
    last = run.memo.get("time")
    if last is not None and (last[0] is acc or last[0] == acc) and (last[1] is opt or last[1] == opt):
        ts: TimeStatics = last[2]
        return ts
    setup, prof, model = run.setup, run.profile, run.model
    kf = dict(opt.corrections)
    rates = card_rates(run, acc, opt, kf)
    head_chunk = LITGPT_CHUNK if prof.quantizes_lm_head and model.lm_head_params else 0
    frozen_grads = frozen_weights_get_gradients(run)
    fp = flop_plan(model, setup, run.dtypes, run.targets, run.attn, run.loss, quant_head_chunk=head_chunk,
                   frozen_weight_grads=frozen_grads)
    gemm_kernels, other_kernels, dequant_kernels = fp.kernels
    compiled = opt.compiled or setup.compile
    fused = compiled or prof.model_code == "unsloth"
    deq = dequant_bytes_per_weight(setup, prof.model_code, compiled)
    dequant_kernels *= kernels_per_dequant(setup, prof.model_code, compiled)
    dequant_s = fp.dequant * deq / rates.dev_bw
    k_over = kf.get("overhead", 1.0)
    launch = DISPATCH_SECONDS * (FUSED_OPS if compiled else 1.0) * k_over
    other_kernels = other_kernels * (FUSED_OPS if fused else 1.0)
    unit_s = (fsdp_unit_ops(setup) * OP_DISPATCH_SECONDS * model.n_layers * k_over
              if run.wrapper.shards_parameters else 0.0)
    upd = optimizer_terms(run, rates.bw, k_over)
    coll = collective_terms(run, acc, opt, kf)
    off = offload_terms(run, kf)
    copies = gradient_copy_bytes(run)
    pp = run.param_plan
    ts = TimeStatics(
        peak=rates.peak, u=rates.u, cls=rates.cls, dev_bw=rates.dev_bw, bw=rates.bw, fused=fused, flops=fp,
        passes=2 + (1 if setup.gradient_checkpointing else 0),
        weight_bytes=pp.weight_bytes + pp.adapter_bytes,
        grad_bytes=(pp.trainable_params * pp.trainable_bytes
                    + (model.params_layers * run.dtypes.frozen_weight if frozen_grads else 0)),
        traffic_factor=FUSED_TRAFFIC if fused else 1.0,
        gemm_launch=gemm_kernels * launch, other_launch=other_kernels * launch, other_kernels=other_kernels,
        dequant_s=dequant_s, dequant_part=max(dequant_kernels * launch, dequant_s),
        dequant_library=dequant_library(setup, prof.model_code), dequant_s_per_elem=deq / rates.dev_bw,
        launch=launch, launch_s=(gemm_kernels + other_kernels + dequant_kernels) * launch, unit_s=unit_s,
        optimizer_s=upd.optimizer_s, optimizer_launch_s=upd.optimizer_launch_s, paged=upd.paged,
        host=corrected_link(host_link(acc), kf.get("offload", 1.0)), links=coll.links,
        link_gbs=coll.link.gbs, per_micro=coll.per_micro, gather_s=coll.gather_s,
        gathers_wait=coll.gathers_wait, per_step=coll.per_step,
        serial=coll.serial, bucket=coll.bucket, offload_step_bytes=off.step_bytes,
        offload_micro_bytes=off.micro_bytes, cpu_optimizer_s=off.cpu_optimizer_s,
        assumptions_head=tuple(coll.notes + ([off.note] if off.note else [])),
        assumptions_tail=rate_notes(run, rates, fused), fixed_s=MICRO_BATCH_FIXED_SECONDS * k_over,
        card_known=rates.eff.known, link_name=coll.link.name, link_stated=bool(opt.peer_link),
        accum_trip_bytes=off.accum_trip_bytes, accum_trip_per_micro=off.accum_trip_per_micro,
        accum_add_bytes=off.accum_add_bytes,
        grad_copy_micro_bytes=copies[0], grad_copy_step_bytes=copies[1],
        flat_grad_bytes=flat_gradient_bytes(run))
    run.memo["time"] = (acc, opt, ts)
    return ts
