"""Time of one optimizer step on one accelerator model: compute, memory traffic, overhead, communication.

Three regimes (H. He, "Making Deep Learning Go Brrrr From First Principles", horace.io/brrr_intro.html):
- compute: matmul FLOPs (``compute.flops_per_token``) at an achievable fraction of the card's dense tensor
  peak for the matmul dtype (``GEMM_EFFICIENCY`` by card class), but never faster than reading the weights
  the matmuls use (the roofline bound that rules at small micro-batches);
- memory: element-wise kernels move ``traffic_bytes`` per token at an achievable fraction of the memory
  bandwidth (``BW_EFFICIENCY``); bitsandbytes rebuilds 16-bit weights per matmul (``DEQUANT_*``);
- overhead: the CPU launches kernels one by one in eager PyTorch; a micro-batch can not finish before its
  kernels are launched (``DISPATCH_SECONDS``). GPU work queues behind the CPU, so a micro-batch takes the
  larger of the GPU time and the launch time, not their sum.
Per optimizer step: ``grad_accum`` micro-batches, the optimizer update (memory-bound), the exposed part of
the gradient / parameter collectives (``links.py`` bandwidths), CPU-offload copies over the host link.

Every constant below names its source or says how it was chosen; ``benchmarks/throughput.py`` reports how
far the whole model is from the published throughput rows of the calibration data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tuneplan.estimator.compute import BWD_KERNELS_PER_FWD, BWD_TRAFFIC_PER_FWD, FlopCount, flops_at
from tuneplan.estimator.time_statics import RuntimeOptions as RuntimeOptions
from tuneplan.estimator.time_statics import TimeStatics, time_statics
from tuneplan.estimator.time_statics import UnknownThroughput as UnknownThroughput
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run
    from tuneplan.estimator.types import MemoryBreakdown


@dataclass(slots=True)
class StepTime:
    """One optimizer step's time. Not frozen, with slots: one is made per estimate, and a frozen
    dataclass's ``__init__`` costs several times as much."""

    step_seconds: float  # one optimizer step: grad_accum micro-batches + update + exposed communication
    micro_batch_seconds: float
    tokens_per_step: int  # all GPUs together
    tokens_per_second: float  # all GPUs together
    tokens_per_second_per_gpu: float
    bound: str  # compute | memory | overhead (what sets the micro-batch time)
    mfu: float  # model FLOPs (our count, without the recompute) / (dense peak x time)
    components: dict[str, float] = field(default_factory=dict)  # seconds per optimizer step, per GPU
    flops: FlopCount | None = None
    links: dict[str, str] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    # seconds per optimizer step per GPU by what limits them; the five add up to step_seconds:
    # compute (matmuls at the tensor rate), memory_bound (kernels bound by memory bandwidth: element-wise
    # ops, weight reads at small batches, dequantization, the optimizer update), communication (the part of
    # the collectives compute does not hide), offload (host link copies and the CPU optimizer step),
    # overhead (kernel launches, framework hooks, fixed per micro-batch cost not hidden behind GPU work)
    breakdown: dict[str, float] = field(default_factory=dict)
    breakdown_detail: dict[str, float] = field(default_factory=dict)  # named parts inside the five
    dequant_library: str = "bitsandbytes"  # what rebuilds the 16-bit weights of a quantized run
    card_known: str = "spec-derived"  # measured | spec-derived | proxy (estimator/gemm_efficiency.py)
    link_name: str = ""
    link_stated: bool = False


def step_time(model: ModelSpec, setup: TrainSetup, acc: Accelerator,
              options: RuntimeOptions | None = None) -> StepTime:
    """Seconds per optimizer step of ``setup`` (already resolved) on ``acc``. Raises UnknownThroughput.
    Resolves the run; :func:`run_step_time` is the same on a resolved ``Run``."""
    from tuneplan.estimator.run import resolve_run

    return run_step_time(resolve_run(model, setup), acc, options)


@dataclass(slots=True)
class MicroBatch:
    """One micro-batch on one GPU, seconds (a dataclass with slots: one is made per estimate)."""

    gemm_s: float  # the matmul FLOPs at the tensor rate
    weights_s: float  # reading every weight per pass (and the gradients) at the streaming bandwidth
    matmul_s: float
    elem_s: float
    dequant_s: float
    kernels_s: float  # the three kernel classes, each the longer of its launches and its work
    micro_s: float
    gpu_s: float
    bound: str


def micro_batch(ts: TimeStatics, fl: FlopCount, setup: TrainSetup) -> MicroBatch:
    """Each class of kernels takes the longer of its launches and its work (a per-kernel roofline):

    - matmuls: ``max(FLOPs x tokens / (peak x u), (passes x weight bytes + gradient bytes) / bw)`` (a
      gradient accumulated over micro-batches is read and written: twice its bytes);
    - element-wise: ``traffic x tokens x fused factor / bw``, plus FSDP1's flat-gradient cat and
      accumulation (``flat_grad_bytes``);
    - dequantization: the block linears' rebuilds plus a chunked quantized head's, per chunk;
    then the sharded units' CPU work and the fixed cost per micro-batch are added."""
    tokens = setup.batch * setup.seq
    gemm_s = fl.total * tokens / (ts.peak * 1e12 * ts.u)
    grad_rw = ts.grad_bytes * (2 if setup.grad_accum > 1 else 1)
    # ZeRO-3/FSDP gather the weights: all are read
    weights_s = (ts.passes * ts.weight_bytes + grad_rw) / ts.bw
    # the larger of two floats written out as max(a, b) decides (a unless b > a): every estimate times a
    # micro-batch, and the builtin's call costs more than the rest of a line
    matmul_s = weights_s if weights_s > gemm_s else gemm_s
    elem_s = fl.traffic_bytes * tokens * ts.traffic_factor / ts.bw
    if ts.flat_grad_bytes:
        # the cat of the views' gradients (read them, write the flat gradient), then AccumulateGrad's
        # in-place add on every micro-batch but a step's first (read both, write one; the first takes the
        # new gradient as it is): (ga - 1) / ga of them on average
        ga = setup.grad_accum
        elem_s = elem_s + (2.0 + 3.0 * (ga - 1) / ga) * ts.flat_grad_bytes / ts.bw
    head_elems = fl.dequant_elements - ts.flops.dequant  # a quantized lm_head, rebuilt per chunk
    dequant_s = ts.dequant_s + head_elems * ts.dequant_s_per_elem
    gemm_launch, other_launch = ts.gemm_launch, ts.other_launch
    gemm_part = matmul_s if matmul_s > gemm_launch else gemm_launch
    other_part = elem_s if elem_s > other_launch else other_launch
    dequant_part = ts.dequant_part
    if head_elems:
        head_kernels = 2 * -(-setup.seq // ts.flops.head_chunk)
        dequant_part = max(ts.dequant_part + head_kernels * ts.launch, dequant_s)
    micro_s = gemm_part + other_part + dequant_part + ts.unit_s + ts.fixed_s
    gpu_s = matmul_s + elem_s + dequant_s
    if ts.launch_s >= gpu_s:
        bound = "overhead"
    elif matmul_s >= elem_s + dequant_s and gemm_s >= weights_s:
        bound = "compute"
    else:
        bound = "memory"
    return MicroBatch(gemm_s, weights_s, matmul_s, elem_s, dequant_s, gemm_part + other_part + dequant_part,
                      micro_s, gpu_s, bound)


def paged_seconds(run: Run, acc: Accelerator, ts: TimeStatics, memory: MemoryBreakdown | None,
                  links: dict[str, str], assumptions: list[str]) -> float:
    """Paged (unified-memory) optimizer states that do not fit next to the step's peak are paged out to
    the host and back every update (bitsandbytes paged optimizers: cudaMallocManaged):
    ``2 x spill / host link`` (for a run with paged states: ``ts.paged``)."""
    if memory is None:
        from tuneplan.estimator.memory import memory_of

        memory = memory_of(run)
    spill = max(0, memory.paged_bytes - max(acc.memory_bytes - memory.device_peak_bytes, 0))
    if not spill:
        return 0.0
    host = ts.host
    links["host"] = f"{host.name}: {host.gbs:g} GB/s per GPU ({host.source})"
    assumptions.append(f"paged optimizer: {spill / 2**30:.1f} GiB of states do not fit on the card and "
                       "cross the host link twice per step")
    return 2 * spill / (host.gbs * 1e9)


def exposed_communication(run: Run, ts: TimeStatics, fl: FlopCount, mb: MicroBatch) -> float:
    """The part of the collectives compute does not hide: per micro-batch and per step, ``max(collective
    - window, last bucket's share)``, where the window is the micro-batch's GPU time under ZeRO-3/FSDP
    (prefetched gathers overlap forward and backward) and its backward share otherwise (gradient buckets
    reduce while the backward runs); the per-step collectives hide in what the last micro-batch's own
    leave of it. Serial collectives, and gathers that wait for the compute before them
    (``gathers_wait``), add whole."""
    flops = fl.total
    bwd_share = (fl.backward + fl.recompute) / flops if flops else 0.5
    window = mb.gpu_s if run.wrapper.shards_parameters else mb.gpu_s * bwd_share
    exposed = run.setup.grad_accum * ts.gathers_wait
    for amount, count in ((ts.per_micro - ts.gathers_wait, run.setup.grad_accum), (ts.per_step, 1)):
        if amount <= 0:
            continue
        total_bytes = amount * ts.link_gbs * 1e9
        tail = amount * min(1.0, ts.bucket / total_bytes) if total_bytes else 0.0
        exposed += count * max(amount - window, tail)
        window = max(window - amount, 0.0)  # the step's collectives hide in what the last one leaves
    exposed += ts.serial
    return exposed


def accumulation_trips(setup: TrainSetup, ts: TimeStatics) -> int:
    """How often per step ZeRO-1/2's offloaded gradients go up to the GPU and back while they accumulate:
    every micro-batch under ZeRO-2, once under ZeRO-1, never for a lone micro-batch."""
    ga = setup.grad_accum
    return (ga if ts.accum_trip_per_micro else 1) if ga > 1 and ts.accum_trip_bytes else 0


def offload_seconds(setup: TrainSetup, ts: TimeStatics, links: dict[str, str], window: float = 0.0) -> float:
    """CPU offload over the host link (DeepSpeed ZeRO-Offload / FSDP CPUOffload): the step's and every
    micro-batch's copies at the host link (the latter less ``window``, the compute they run beside), the
    gradients' round trips through the host buffer they accumulate in (ZeRO-1/2 over several
    micro-batches), plus the CPU optimizer step."""
    if setup.offload == "none":
        return 0.0
    host = ts.host
    links["host"] = f"{host.name}: {host.gbs:g} GB/s per GPU ({host.source})"
    ga = setup.grad_accum
    rate = host.gbs * 1e9
    micro_s = ts.offload_micro_bytes / rate
    offload_s = ((ts.offload_step_bytes + accumulation_trips(setup, ts) * ts.accum_trip_bytes) / rate
                 + ga * max(micro_s - window, 0.0))
    return offload_s + ts.cpu_optimizer_s


def floor_at_one_gpu(run: Run, acc: Accelerator, opt: RuntimeOptions, step_s: float,
                     parts: tuple[dict[str, float], dict[str, float]],
                     assumptions: list[str]) -> tuple[float, dict[str, float], dict[str, float]]:
    """Never faster per GPU than the same micro-batches on one GPU: sharding the update saves less than
    the collectives cost at a fixed per-GPU batch. Paging and offload are left out of the floor (they come
    from one card's memory, which sharding relieves), and so is a per-tensor optimizer's launch time when
    the optimizer is sharded (sharded optimizers step flat partitions). ``parts``: the breakdown and its
    detail, replaced by the single GPU's when the floor holds."""
    one = run_step_time(one_gpu_run(run), acc, opt)
    one_launch = one.components.get("optimizer_launches", 0.0) if run.wrapper.shards_optimizer else 0.0
    floor = one.step_seconds - one.components.get("paged_optimizer", 0.0) - one_launch
    if floor <= step_s:
        return step_s, parts[0], parts[1]
    assumptions.append("per-GPU time floored at the single-GPU step (no superlinear scaling)")
    breakdown = dict(one.breakdown, memory_bound=one.breakdown["memory_bound"]
                     - one.components.get("paged_optimizer", 0.0),
                     overhead=one.breakdown["overhead"] - one_launch)
    detail = dict(one.breakdown_detail, optimizer_launches=one.breakdown_detail["optimizer_launches"]
                  - one_launch)
    return floor, breakdown, detail


def run_step_time(run: Run, acc: Accelerator, options: RuntimeOptions | None = None,
                  memory: MemoryBreakdown | None = None) -> StepTime:
    """Seconds per optimizer step of ``run`` at its own micro-batch, sequence length and accumulation on
    ``acc`` (``memory``: the run's breakdown when the caller has it, for a paged optimizer's spill):
    ``grad_accum x micro-batch + update + its launches + paging + exposed communication + offload +
    ZeRO-1/2's gradient copies``,
    floored at one GPU's step for a multi-GPU run. Raises UnknownThroughput."""
    opt = options or RuntimeOptions()
    ts = time_statics(run, acc, opt)
    setup = run.setup
    ga = setup.grad_accum
    n = setup.world_size
    tokens = setup.batch * setup.seq
    fl = flops_at(ts.flops, setup.seq)
    assumptions: list[str] = []
    links: dict[str, str] = {}
    mb = micro_batch(ts, fl, setup)
    optimizer_s = ts.optimizer_s
    paged_s = paged_seconds(run, acc, ts, memory, links, assumptions) if ts.paged else 0.0
    links.update(ts.links)
    assumptions.extend(ts.assumptions_head)
    comm_total = ga * ts.per_micro + ts.per_step + ts.serial
    # a run without collectives to overlap (one GPU) adds what nothing hides: no window to work out
    exposed = (exposed_communication(run, ts, fl, mb)
               if ts.per_micro - ts.gathers_wait > 0 or ts.per_step > 0 else ga * ts.gathers_wait + ts.serial)
    # gathers that wait for the compute leave the links idle while a layer computes: FSDP1's pre_unshard
    # copies the next unit's host shard to the device on its own stream before the rate limiter's wait
    # (torch/distributed/fsdp/_runtime_utils.py _unshard), so those copies run beside the compute
    offload_s = (offload_seconds(setup, ts, links, mb.gpu_s if ts.gathers_wait else 0.0)
                 if setup.offload != "none" else 0.0)
    if setup.device_map != "none" and setup.gpus > 1:
        # one process over several cards: the hand-overs between them, hidden by nothing (device_map.py)
        from tuneplan.estimator.device_map import copy_seconds

        hand_over_s, links["device_map"] = copy_seconds(run, acc)
        exposed += ga * hand_over_s
        comm_total += ga * hand_over_s
        assumptions.append(f"device_map over {setup.gpus} cards: one works at a time, so the step is one "
                           f"card's for the whole model plus {hand_over_s * 1e3:.3g} ms of copies between "
                           "cards per micro-batch (accelerate's per-module hooks not counted)")
    trips = accumulation_trips(setup, ts) if ga > 1 else 0
    copies_s = (ga * ts.grad_copy_micro_bytes + ts.grad_copy_step_bytes  # ZeRO-1/2's buckets
                + trips * ts.accum_add_bytes) / ts.bw
    step_s = ga * mb.micro_s + optimizer_s + ts.optimizer_launch_s + paged_s + exposed + offload_s + copies_s
    tensor_s = mb.gemm_s if mb.gemm_s >= mb.weights_s else 0.0  # matmuls held by the tensor cores
    breakdown = {
        "compute": ga * tensor_s,
        "memory_bound": (ga * (mb.matmul_s - tensor_s + mb.elem_s + mb.dequant_s) + optimizer_s + paged_s
                         + copies_s),
        "communication": exposed,
        "offload": offload_s,
        "overhead": ga * (mb.micro_s - mb.gpu_s) + ts.optimizer_launch_s,
    }
    # max(x, 0.0) as the builtin decides it (x unless 0.0 > x), without its call
    launches_s, fixed_s = mb.kernels_s - mb.gpu_s, mb.micro_s - mb.gpu_s
    detail = {"dequantization": ga * mb.dequant_s, "optimizer_update": optimizer_s + paged_s,
              "optimizer_launches": ts.optimizer_launch_s,
              "kernel_launches": ga * (0.0 if 0.0 > launches_s else launches_s),
              "sharded_unit_fixed": ga * ts.unit_s, "micro_batch_fixed": ga * ts.fixed_s,
              "gradient_copies": copies_s}
    if n > 1:
        step_s, breakdown, detail = floor_at_one_gpu(run, acc, opt, step_s, (breakdown, detail), assumptions)
    tps_gpu = tokens * ga / step_s
    mfu = (fl.forward + fl.backward) * tokens * ga / (step_s * ts.peak * 1e12)
    components = {
        "matmul": ga * mb.matmul_s, "elementwise": ga * mb.elem_s,
        "dequant": ga * mb.dequant_s, "launch_and_fixed": ga * (0.0 if 0.0 > fixed_s else fixed_s),
        "optimizer": optimizer_s, "optimizer_launches": ts.optimizer_launch_s, "paged_optimizer": paged_s,
        "communication_exposed": exposed,
        "communication_total": comm_total, "offload": offload_s, "gradient_copies": copies_s,
    }
    assumptions.extend(ts.assumptions_tail)
    per_card = setup.device_map == "none"  # a device_map run's cards share one process's work
    # positional, in StepTime's field order: 17 keyword arguments cost a micro-batch's arithmetic again
    return StepTime(step_s, mb.micro_s, tokens * ga * n,  # step_seconds, micro_batch_seconds, tokens_per_step
                    tps_gpu * n,  # tokens_per_second
                    tps_gpu if per_card else tps_gpu / setup.cards,  # tokens_per_second_per_gpu
                    mb.bound, mfu if per_card else mfu / setup.cards,  # bound, mfu
                    components, fl, links, assumptions, breakdown, detail,  # ..., breakdown_detail
                    ts.dequant_library, ts.card_known, ts.link_name if n > 1 else "", ts.link_stated)


def one_gpu_run(run: Run) -> Run:
    """The same micro-batches on a single GPU, unsharded, without offload (the multi-GPU floor), resolved
    once per run and reshaped to the run's shape."""
    from tuneplan.estimator.run import resolve_run

    one = run.memo.get("one_gpu")
    if one is None:
        # resolved from the run's model as the single-GPU setup would be on its own
        one = run.memo["one_gpu"] = resolve_run(
            run.model, run.setup.replace(gpus=1, nodes=1, zero=0, fsdp=False, offload="none"))
    s, o = run.setup, one.setup
    if (o.batch, o.seq, o.grad_accum) != (s.batch, s.seq, s.grad_accum):
        one = one.reshaped(batch=s.batch, seq=s.seq, grad_accum=s.grad_accum)
    return one


@dataclass(frozen=True)
class EvalTime:
    """Time of the evaluation work some trainers do inside their timed loop (litgpt's ``fit`` validates and
    generates an example every ``eval.interval`` steps)."""

    # one forward-only micro-batch at the run's shape (no_grad: no backward, no recompute)
    forward_seconds: float
    token_seconds: float  # one generated token at batch 1 with a KV cache


def run_eval_time(run: Run, acc: Accelerator, options: RuntimeOptions | None = None) -> EvalTime:
    """Forward-only micro-batch and one decoded token of ``run`` on ``acc``, from the same statics as the
    step:

    - forward: the forward matmul FLOPs at the tensor rate, but never faster than one read of the weights;
      the forward share of the element-wise traffic and of the launches (1 of the 1 + 2 (+1 recompute)
      traffic passes, 1 of the 1 + 1.5 (+1) kernel passes of ``compute.py``); one dequantization pass;
    - a generated token (batch 1, KV cache): one read of the weights at the streaming bandwidth, or the
      forward's launches when those take longer (bitsandbytes multiplies one token against the 4-bit weights
      directly, ``gemv_4bit``, so no dequantization pass);
    - ZeRO-3/FSDP: every forward, and so every generated token, all-gathers every sharded parameter (FSDP
      unshards each unit in its forward pre-hook), plus the forward half of the per-unit CPU work.
    """
    opt = options or RuntimeOptions()
    ts = time_statics(run, acc, opt)
    setup = run.setup
    tokens = setup.batch * setup.seq
    fl = flops_at(ts.flops, setup.seq)
    ckpt = 1.0 if setup.gradient_checkpointing else 0.0
    kpasses = 1.0 + BWD_KERNELS_PER_FWD + ckpt
    tpasses = 1.0 + BWD_TRAFFIC_PER_FWD + ckpt
    t = fl.traffic_parts
    fwd_traffic = ((t.get("layers", 0.0) + t.get("adapters", 0.0) + t.get("attention_scores", 0.0)) / tpasses
                   + t.get("loss", 0.0) / 2 + t.get("embedding", 0.0))
    matmul_s = max(fl.forward * tokens / (ts.peak * 1e12 * ts.u), ts.weight_bytes / ts.bw)
    elem_s = fwd_traffic * tokens * ts.traffic_factor / ts.bw
    dequant_s = ts.dequant_s / (2.0 + ckpt)
    gpu_s = matmul_s + elem_s + dequant_s
    launch_s = ts.launch_s / kpasses
    forward_s = (max(gpu_s, launch_s) + ts.unit_s / 2 + max(0.0, ts.gather_s - gpu_s)
                 + ts.fixed_s)
    token_launch_s = (ts.gemm_launch + ts.other_launch) / kpasses
    token_s = max(ts.weight_bytes / ts.bw, token_launch_s) + ts.unit_s / 2 + ts.gather_s
    return EvalTime(forward_seconds=forward_s, token_seconds=token_s)
