"""The collectives' seconds of a step on the slowest link a ring crosses, computed once per (run, card,
options) for ``time_statics``: the wrapper's volumes at the link's bus bandwidth, each NCCL call's latency
(``nccl.py``), one all-gather of every sharded weight, and the last bucket no compute can hide."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

from tuneplan.estimator.links import Link, intra_node_link, network_link, ring_factor, stated_link
from tuneplan.estimator.nccl import CALLS_PER_SHARDED_UNIT, call_overhead, link_kind
from tuneplan.estimator.wrappers.fsdp import accumulates_unsharded, frozen_weights_get_gradients
from tuneplan.specs.hardware import Accelerator

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run
    from tuneplan.estimator.time_statics import RuntimeOptions
    from tuneplan.estimator.wrappers.base import Collectives


def corrected_link(link: Link, factor: float) -> Link:
    """``link`` carrying 1/``factor`` of its bandwidth (a calibrated communication or offload time)."""
    if factor == 1.0:
        return link
    return Link(link.name, link.gbs / factor, f"{link.source}; x {1 / factor:.2f} measured on this machine")


class CollectiveTerms(NamedTuple):
    links: dict[str, str]
    link: Link  # the slowest link a collective crosses, calibrated
    per_micro: float
    per_step: float
    serial: float
    gather_s: float
    bucket: float
    notes: list[str]
    gathers_wait: float = 0.0  # seconds of ``per_micro`` that compute cannot hide (gathers_wait_for_compute)


# ``Profile.fsdp_gathers_wait``: Answer.AI's fsdp_qlora train.py wraps with ``limit_all_gathers=True`` and
# each LoRA matrix as a unit of its own (lambda_auto_wrap_policy on every leaf whose weight requires grad,
# beside the decoder layers). The HF Trainer wraps the same way but takes limit_all_gathers from accelerate,
# whose default has changed between releases: not asserted there.


def gathers_wait_for_compute(run: Run) -> bool:
    """Whether a decoder layer's all-gathers run after the compute before them, not beside it.

    FSDP1's rate limiter (``limit_all_gathers=True``; torch/distributed/fsdp/_limiter_utils.py
    ``_FreeEventQueue``, at most 2 in flight): every unit's reshard records a free event, and every unit's
    unshard first takes the oldest event once two are queued and waits for it on the CPU
    (``_runtime_utils._unshard``: ``event.synchronize()``) before it issues its all-gather. With each LoRA
    matrix a unit of its own, ~12 tiny units reshard inside every layer: when the next layer's unshard
    runs, the oldest queued event is the layer's second-last adapter (``lora_A`` of its last target), so
    the next layer's all-gather is issued only once the layer's compute has all but ended, and the next
    layer's compute waits for it: the gather and the compute take turns. In the backward the prefetch
    (BACKWARD_PRE) after a layer is its last adapter unit, and the next layer is gathered only when the
    layer's first adapter starts its backward, at the layer's end (``fsdp_layers_gathered``). So both
    gathers of every layer add whole; the adapters' reduce-scatters still hide behind the backward."""
    setup = run.setup
    return (setup.fsdp and setup.fsdp_version == 1 and setup.world_size > 1 and setup.is_lora
            and run.profile.fsdp_gathers_wait)


def collective_terms(run: Run, acc: Accelerator, opt: RuntimeOptions,
                     kf: dict[str, float]) -> CollectiveTerms:
    """The collectives' seconds per micro-batch, per step and serial on the slowest link a ring crosses
    (the stated or catalog link of a node, the network between nodes): the wrapper's volumes at the bus
    bandwidth, plus each NCCL call's latency (``call_latencies``); ``gather_s``: one all-gather of every
    sharded weight, ``bytes x (n-1)/n / link`` plus one call per unit; ``bucket``: the wrapper's last
    bucket, the part of a collective no compute can hide."""
    setup, pp, wrapper = run.setup, run.param_plan, run.wrapper
    links: dict[str, str] = {}
    intra = stated_link(opt.peer_link, acc, setup.gpus) if opt.peer_link else intra_node_link(acc, setup.gpus)
    link = intra
    links["intra_node"] = f"{link.name}: {link.gbs:g} GB/s per GPU ({link.source})"
    if setup.nodes > 1:
        net = network_link(opt.inter_node_gbs)
        links["inter_node"] = f"{net.name}: {net.gbs:g} GB/s per GPU ({net.source})"
        if net.gbs < link.gbs:
            link = net
    link = corrected_link(link, kf.get("communication", 1.0))
    comm_bytes = wrapper.gradient_wire_bytes(run)
    gathered = pp.weight_bytes + pp.adapter_bytes
    coll = wrapper.collectives(run, grad_bytes=comm_bytes, gathered_bytes=gathered, link=link)
    n = setup.world_size
    bucket = wrapper.last_bucket_bytes(run, comm_bytes)
    lat = call_latencies(run, intra.name, link.gbs, pp.trainable_params * comm_bytes, bucket, coll)
    gather_s = (gathered * ring_factor("all_gather", n) / (link.gbs * 1e9) + lat.gather
                if wrapper.shards_parameters else 0.0)
    notes = list(coll.notes) + ([lat.note] if lat.note else [])
    gathers_wait = 0.0
    if gathers_wait_for_compute(run):
        gathers_wait = 2 * gather_s  # the forward's and the backward's gather of every unit
        notes.append("FSDP limit_all_gathers with a unit per LoRA matrix: each layer's all-gathers wait for "
                     "the compute before them (forward and backward), not hidden")
    per_micro, per_step = coll.per_micro_batch + lat.per_micro, coll.per_step + lat.per_step
    if setup.fsdp and n > 1:
        per_micro, per_step = fsdp_reduce_scatter(run, comm_bytes, link, per_micro, per_step, notes)
    return CollectiveTerms(links, link, per_micro, per_step, coll.serial + lat.serial, gather_s, bucket,
                           notes, gathers_wait)


def reduces_once_per_step(run: Run) -> bool:
    """Whether the loop runs every accumulating micro-batch under FSDP's ``no_sync``, so that only the step's
    last micro-batch reduce-scatters (LitGPT: ``fabric.no_backward_sync``; the HF Trainer and LLaMA-Factory:
    ``accelerator.no_sync``; fsdp_qlora's train.py with CPU offload: ``wrappers.fsdp.accumulates_unsharded``).
    """
    return accumulates_unsharded(run)


def fsdp_reduce_scatter(run: Run, comm_bytes: int, link: Link, per_micro: float, per_step: float,
                        notes: list[str]) -> tuple[float, float]:
    """``(per_micro, per_step)`` with FSDP's reduce-scatter as the frameworks run it. The wrapper counts the
    trainable parameters' gradients every micro-batch; a unit whose flat parameter mixes frozen and
    trainable weights reduce-scatters the gradient of all of them (``frozen_weights_get_gradients``), and
    under ``no_sync`` (``reduces_once_per_step``) the reduce-scatter runs once per step, not per
    micro-batch."""
    pp = run.param_plan
    per_byte = ring_factor("reduce_scatter", run.setup.world_size) / (link.gbs * 1e9)
    counted = pp.trainable_params * comm_bytes * per_byte
    reduced = counted
    if frozen_weights_get_gradients(run):
        reduced += run.model.params_layers * comm_bytes * per_byte
    if reduces_once_per_step(run):
        notes.append("FSDP no_sync while accumulating: gradients reduce-scattered once per step")
        return per_micro - counted, per_step + reduced
    return per_micro - counted + reduced, per_step


class CallLatencies(NamedTuple):
    per_micro: float
    per_step: float
    serial: float
    gather: float  # one all-gather call per sharded unit (the evaluation's forward)
    note: str | None


def call_latencies(run: Run, intra_name: str, bus_gbs: float, grad_bytes: float, bucket: float,
                   coll: Collectives) -> CallLatencies:
    """NCCL's per-call cost beyond the bytes (``nccl.call_overhead``), by how often each call runs:

    - FSDP / ZeRO-3: ``CALLS_PER_SHARDED_UNIT`` ring calls per unit per micro-batch, units = layers + 1
      (the root unit: embeddings, final norm, head); the evaluation's forward gathers each unit once;
    - DDP: one all-reduce per gradient bucket per step, ring or tree as NCCL's model picks;
    - ZeRO-1/2: one reduce-scatter per bucket (per micro-batch under ZeRO-2, where the wrapper reduces per
      micro-batch) and one all-gather of the updated weights per step."""
    setup = run.setup
    n, nodes = setup.world_size, setup.nodes
    if n <= 1:
        return CallLatencies(0.0, 0.0, 0.0, 0.0, None)
    if run.wrapper.shards_parameters:
        units = run.model.n_layers + 1
        one = call_overhead("all_gather", 0.0, n, nodes, intra_name, bus_gbs)
        per_micro = units * CALLS_PER_SHARDED_UNIT * one
        note = (f"NCCL: {units * CALLS_PER_SHARDED_UNIT} calls per micro-batch (gather twice, reduce-scatter "
                f"once per unit) at {one * 1e6:.0f} us each (NCCL's latency model, {link_kind(intra_name)})")
        return CallLatencies(per_micro, 0.0, 0.0, units * one, note)
    buckets = max(1, math.ceil(grad_bytes / bucket)) if bucket > 0 else 1
    kind = "reduce_scatter" if run.wrapper.shards_optimizer else "all_reduce"
    one = call_overhead(kind, grad_bytes / buckets, n, nodes, intra_name, bus_gbs)
    serial = call_overhead("all_gather", 0.0, n, nodes, intra_name, bus_gbs) if coll.serial > 0 else 0.0
    per_micro = buckets * one if coll.per_micro_batch > 0 else 0.0
    per_step = buckets * one if coll.per_step > 0 and not per_micro else 0.0
    note = (f"NCCL: {buckets} {kind.replace('_', '-')} call(s) of {grad_bytes / buckets / 1e9:.3g} GB at "
            f"{one * 1e6:.0f} us each beyond the bytes (NCCL's latency model, {link_kind(intra_name)})")
    return CallLatencies(per_micro, per_step, serial, 0.0, note)
