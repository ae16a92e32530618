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

from tuneplan.estimator.compute import (
    BWD_KERNELS_PER_FWD,
    BWD_TRAFFIC_PER_FWD,
    FlopCount,
    FlopPlan,
    flop_plan,
    flops_at,
)
from tuneplan.estimator.gemm_efficiency import card_efficiency, unverified_figures
from tuneplan.estimator.links import Link, host_link, intra_node_link, network_link, ring_factor, stated_link
from tuneplan.estimator.logits import LITGPT_CHUNK
from tuneplan.estimator.optimizer import optimizer_plan
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run
    from tuneplan.estimator.types import MemoryBreakdown

# Achievable fraction of the dense tensor peak for the large GEMMs of a training step, by card class.
# cuBLAS reaches about 80% of the dense bf16/fp16 peak on large square GEMMs on V100/A100/Ada/GA102
# (NVIDIA "Matrix Multiplication Background" user guide, fig. "performance of GEMMs"; A100 ~250 of 312
# TFLOPS); Hopper reaches a smaller fraction of its larger peak with cuBLAS (~65-70%: the FP8/BF16 GEMM
# results in NVIDIA's H100 tuning guide and PyTorch's Hopper GEMM benchmarks); AMD Instinct's hipBLASLt
# reaches about half of the marketed peak (SemiAnalysis MI300X vs H100 benchmark, Dec 2024).
# Ada (compute capability 8.9): cuBLAS HGEMM on an L20 (AD102, 119.5 TFLOPS dense fp16 tensor peak) runs
# 105-115 TFLOPS on large shapes (DefTruth/CUDA-Learn-Notes hgemm README, measured against cuBLAS): ~0.92.
GEMM_EFFICIENCY = {"nvidia-hbm": 0.80, "nvidia-gddr": 0.80, "nvidia-ada": 0.92, "nvidia-hopper": 0.68,
                   "amd": 0.50, "other": 0.50}
# Achievable fraction of peak memory bandwidth for streaming element-wise kernels (STREAM-like copies
# reach 85-90% on A100/H100 HBM, ~85% on GDDR6X; element-wise PyTorch kernels with broadcasting and
# reductions are lower): one value for all cards.
BW_EFFICIENCY = 0.70
# torch.compile / hand-fused kernels (Unsloth's Triton RMSNorm, RoPE, SwiGLU, fused loss) write fewer
# intermediates: element-wise traffic and launched kernels scale by these factors (chosen, not measured:
# fusion removes most intermediate writes of a norm / rotary / gated-activation chain).
FUSED_TRAFFIC = 0.5
FUSED_OPS = 0.3
# bitsandbytes dequantize_4bit reads 0.5 B (+ absmax, ~0.03 B with double quantization) and writes 2 B per
# weight, then the GEMM reads the 16-bit copy once more (2 B). Until bitsandbytes 0.48 its kernel decoded NF4
# with branches and ran below bandwidth: the branch-free lookup-table kernel that replaced it (PR #1746,
# Sept 2025) measured 1.36-2.07x faster on A100 / H100 (PR #1747's benchmarks of the same change), so the
# kernel of the published runs takes ~2x its traffic time. Per weight per pass, at peak bandwidth:
# (2.5 x 2 + 2) / BW_EFFICIENCY = 10 B. (Kept for current versions too: a conservative choice.)
DEQUANT_KERNEL_BYTES = 2.5
BNB_BRANCHY_KERNEL_SLOWDOWN = 2.0
DEQUANT_COPY_READ_BYTES = 2.0
DEQUANT_BYTES_PER_WEIGHT = (DEQUANT_KERNEL_BYTES * BNB_BRANCHY_KERNEL_SLOWDOWN + DEQUANT_COPY_READ_BYTES) / BW_EFFICIENCY
# torchao NF4Tensor (torchtune's QLoRA, torchao/dtypes/nf4tensor.py) rebuilds the weight with PyTorch ops,
# ``get_original_weight``; per weight element (n/2 packed bytes hold n codes), eager:
#   ``>> 4`` and ``& 0b1111`` read 0.5 B and write 0.5 B each; each ``.to(torch.long)`` reads those 0.5 B
#   and writes 4 B; each table lookup ``nf4[codes]`` reads 4 B, writes 1 B (bf16, half the elements);
#   ``repeated.flatten()`` copies the expanded scalers twice (1 B written each); each scaling multiply
#   reads 1 + 1 B, writes 1 B; ``torch.stack`` reads 2 B, writes 2 B:
#   17 B written + 16 B read = 33 B, in 11 kernels plus the scalers' own dequantization (~4 more).
# Under torch.compile one fused kernel reads the codes and writes the 16-bit weight (0.5 + 2 B). Either
# way the GEMM then reads the 16-bit copy (2 B). No branchy bitsandbytes kernel in that path.
TORCHAO_EAGER_DEQUANT_BYTES = 33.0
TORCHAO_EAGER_DEQUANT_KERNELS = 15
TORCHAO_COMPILED_DEQUANT_BYTES = 0.5 + 2.0
# LLM.int8 (8-bit) matmuls decompose outliers and run int8 GEMMs; much slower than 4-bit dequant in
# practice (bitsandbytes README: "8-bit ... slower"); modeled as twice the 4-bit pass (assumption).
INT8_DEQUANT_FACTOR = 2.0
# CPU time per launched kernel in eager PyTorch (horace.io: the "overhead" regime). A GPU cannot work ahead
# of the CPU, so each class of kernels takes the longer of its launches and its execution (a per-kernel
# roofline): small micro-batches are launch-bound. Two factors:
# - every aten op passes Python, pybind, autograd recording and the dispatcher before any launch: ~5-25 us
#   of CPU work per op ("From PyTorch op to kernel launch", jiahuanglin.xyz GPU-kernel lessons, layer-by-layer
#   costs); OP_DISPATCH_SECONDS takes the middle, 15 us;
# - ops per kernel that compute.py counts: transformers' Llama decoder layer dispatches 219 aten ops in
#   forward + backward (LoRA q/v: 246; with checkpointing 338 / 373), views and metadata ops included,
#   against 82.5 / 102.5 / 115.5 / 143.5 kernels counted here: 2.4-2.9, mean 2.6 (counted by running the
#   model code under a TorchDispatchMode, tests/test_time_model.py::test_dispatched_ops_per_counted_kernel).
OP_DISPATCH_SECONDS = 15e-6
OPS_PER_KERNEL = 2.6
DISPATCH_SECONDS = OPS_PER_KERNEL * OP_DISPATCH_SECONDS
# FSDP / ZeRO-3 add CPU work per sharded unit (one decoder layer) per micro-batch: unshard / reshard,
# the views of the original parameters (use_orig_params), gradient padding, pre/post-divide and the copy
# into the sharded gradient. Counted as aten ops by running transformers' Llama wrapped per decoder layer
# in FSDP1 (world size 2, a fake process group, CPU) against the same model unwrapped, forward + backward:
# +93 ops per unit for a full fine-tune, +168 with LoRA q/v (the flat parameter mixes frozen and trained
# tensors), +204 with LoRA and checkpointing (tests/test_time_model.py::test_fsdp_ops_per_unit), at
# OP_DISPATCH_SECONDS each. A lower bound: FSDP's own Python between those ops (hooks, handle and stream
# bookkeeping) is not an aten op; timing the same comparison on a CPU (tiny shapes, so dispatch-bound)
# put FSDP's whole CPU cost at ~2x the plain layer's, which overshoots the published FSDP rows: the truth
# lies between. DeepSpeed ZeRO-3 hooks every submodule: the count is a lower bound there too.
FSDP_UNIT_OPS_FULL = 93
FSDP_UNIT_OPS_LORA = 168
FSDP_UNIT_OPS_LORA_CHECKPOINTED = 204
# The optimizer step launches its own kernels, once per step: a per-parameter loop dispatches a few ops for
# every trainable tensor, a foreach / fused implementation a few ops per chunk of tensors (PyTorch's
# multi_tensor_apply packs up to 36-110 tensors in one launch, by operand count; 48 taken). Counted from the
# implementations' ``step`` (dispatched aten ops, each at OP_DISPATCH_SECONDS):
# - transformers' AdamW (``adamw_hf``): mul_, add_, mul_, addcmul_, sqrt, add_, addcdiv_ per tensor: 7;
# - transformers' Adafactor (factored, no first moment): 28 per matrix (2 norms, the row / column means
#   and their moving averages, the rsqrt approximation, the clip by RMS), ~17 per vector: 22 taken;
# - bitsandbytes 8-bit / paged optimizers: one update kernel per tensor from a Python loop, with its ctypes
#   bookkeeping: 2;
# - torch AdamW foreach (the default on CUDA since 2.0): 9 foreach ops per chunk (step, weight decay, lerp,
#   mul, addcmul, sqrt, div, add, addcdiv); fused AdamW: 1 per chunk; SGD: 1 per chunk.
# The step takes the longer of these launches and its memory traffic (the per-kernel roofline). Sharded
# optimizers (ZeRO: one flat partition per group; FSDP: flat parameters per unit) launch few: left at 0.
OPTIMIZER_OPS_PER_TENSOR = {"adamw-hf": 7, "adafactor": 22, "adamw-8bit": 2, "paged-adamw-8bit": 2,
                            "paged-adamw": 2}
OPTIMIZER_OPS_PER_CHUNK = {"adamw": 9, "adamw-fused": 1, "sgd": 1}
FOREACH_TENSORS_PER_LAUNCH = 48
# Per-micro-batch fixed cost outside the layers: data loading to the GPU, loss bookkeeping, logging.
MICRO_BATCH_FIXED_SECONDS = 2e-3
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


@dataclass(frozen=True)
class StepTime:
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


def corrected_link(link: Link, factor: float) -> Link:
    """``link`` carrying 1/``factor`` of its bandwidth (a calibrated communication or offload time)."""
    if factor == 1.0:
        return link
    return Link(link.name, link.gbs / factor, f"{link.source}; x {1 / factor:.2f} measured on this machine")


def fsdp_unit_ops(setup: TrainSetup) -> int:
    """aten ops FSDP adds per sharded unit per micro-batch (forward + backward), see FSDP_UNIT_OPS_*."""
    if setup.method == "full":
        return FSDP_UNIT_OPS_FULL
    return FSDP_UNIT_OPS_LORA_CHECKPOINTED if setup.gradient_checkpointing else FSDP_UNIT_OPS_LORA


def dequant_bytes_per_weight(setup: TrainSetup, model_code: str, compiled: bool) -> float:
    """Bytes per weight element and dequantization pass, at peak bandwidth (the kernel's traffic divided by
    ``BW_EFFICIENCY``): torchao's NF4 for torchtune's model code, else bitsandbytes (see the constants)."""
    if model_code == "torchtune" and setup.quant_bits == 4:
        kernel = TORCHAO_COMPILED_DEQUANT_BYTES if compiled else TORCHAO_EAGER_DEQUANT_BYTES
        return (kernel + DEQUANT_COPY_READ_BYTES) / BW_EFFICIENCY
    return DEQUANT_BYTES_PER_WEIGHT * (INT8_DEQUANT_FACTOR if setup.quant_bits == 8 else 1.0)


def optimizer_ops(name: str, tensors: int) -> int:
    """aten ops one optimizer step dispatches over ``tensors`` trainable tensors (see OPTIMIZER_OPS_*)."""
    if name in OPTIMIZER_OPS_PER_TENSOR:
        return OPTIMIZER_OPS_PER_TENSOR[name] * tensors
    return OPTIMIZER_OPS_PER_CHUNK.get(name, 0) * -(-tensors // FOREACH_TENSORS_PER_LAUNCH)


def dequant_library(setup: TrainSetup, model_code: str) -> str:
    """The library whose kernels rebuild a quantized run's 16-bit weights (see ``dequant_bytes_per_weight``)."""
    return "torchao NF4" if model_code == "torchtune" and setup.quant_bits == 4 else "bitsandbytes"


def kernels_per_dequant(setup: TrainSetup, model_code: str, compiled: bool) -> int:
    """Kernels one dequantization of one weight launches: bitsandbytes' ``dequantize_4bit`` and a compiled
    torchao kernel 1, eager torchao's ``get_original_weight`` ~15 (``TORCHAO_EAGER_DEQUANT_KERNELS``)."""
    eager_torchao = model_code == "torchtune" and setup.quant_bits == 4 and not compiled
    return TORCHAO_EAGER_DEQUANT_KERNELS if eager_torchao else 1


def card_class(acc: Accelerator) -> str:
    if acc.vendor == "AMD":
        return "amd"
    if acc.vendor != "NVIDIA":
        return "other"
    if acc.compute_capability and acc.compute_capability >= (9, 0) and "HBM" in (acc.memory_type or ""):
        return "nvidia-hopper"
    if acc.compute_capability == (8, 9):
        return "nvidia-ada"
    return "nvidia-hbm" if "HBM" in (acc.memory_type or "") else "nvidia-gddr"


def matmul_peak_tflops(acc: Accelerator, setup: TrainSetup) -> float | None:
    """Dense tensor peak for the matmul dtype. fp16 GEMMs in PyTorch accumulate in fp32, which runs at the
    bf16 rate (consumer cards halve fp16-with-fp16-accumulate figures for fp32 accumulation); fp32 runs on
    CUDA cores (PyTorch's default ``allow_tf32=False`` for matmuls since 1.12)."""
    per_package = acc.fp32_tflops if setup.precision == "fp32" else (acc.bf16_tflops_dense
                                                                      or acc.fp16_fp16acc_tflops_dense)
    if not per_package and (acc.tensor_cores or "").lower().startswith("no"):
        # No tensor cores (Pascal and older): PyTorch's 16-bit GEMMs ask cuBLAS for fp32 accumulation
        # (CUBLAS_COMPUTE_32F), which runs on the fp32 units at the fp32 rate.
        per_package = acc.fp32_tflops
    # one device of a multi-device package (MI250X: 2 GCDs) gets its share of the package's figure
    return per_package / max(1, acc.devices_per_package) if per_package else None


def step_time(model: ModelSpec, setup: TrainSetup, acc: Accelerator,
              options: RuntimeOptions | None = None) -> StepTime:
    """Seconds per optimizer step of ``setup`` (already resolved) on ``acc``. Raises UnknownThroughput.
    Resolves the run; :func:`run_step_time` is the same on a resolved ``Run``."""
    from tuneplan.estimator.run import resolve_run

    return run_step_time(resolve_run(model, setup), acc, options)


@dataclass(frozen=True)
class TimeStatics:
    """The terms of the step time that depend on neither the micro-batch, the sequence length nor the
    accumulation: rates of the card, FLOP coefficients, launches, the optimizer update, the collectives'
    volumes and the host-link copies. Computed once per (run, card, options) by :func:`time_statics`."""

    peak: float
    u: float
    cls: str
    dev_bw: float
    bw: float
    fused: bool
    flops: FlopPlan
    passes: int  # weight reads per micro-batch: forward, backward, recompute
    weight_bytes: int
    grad_bytes: int  # trainable params x bytes (read and written by the backward)
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
    optimizer_launch_s: float  # the optimizer's launches beyond its memory time (per-kernel roofline)
    paged: int  # paged optimizer state bytes
    host: Link
    links: dict[str, str]  # intra_node (and inter_node)
    link_gbs: float
    per_micro: float
    gather_s: float  # one all-gather of every sharded parameter (ZeRO-3/FSDP), seconds; 0 unsharded
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


def time_statics(run: Run, acc: Accelerator, opt: RuntimeOptions) -> TimeStatics:
    """The shape-independent terms of ``run`` on ``acc`` (kept on the run for the last card asked about)."""
    last = run.memo.get("time")
    if last is not None and (last[0] is acc or last[0] == acc) and last[1] == opt:
        return last[2]
    setup, prof, dt, pp, model = run.setup, run.profile, run.dtypes, run.param_plan, run.model
    peak = opt.peak_tflops or matmul_peak_tflops(acc, setup)
    if not peak:
        raise UnknownThroughput(f"{acc.name}: the catalog has no dense tensor peak for {setup.precision} matmuls "
                                "(add bf16_tflops_dense / fp32_tflops with {hardware_file})")
    if not acc.memory_bandwidth_gbs:
        raise UnknownThroughput(f"{acc.name}: the catalog has no memory bandwidth "
                                "(add memory_bandwidth_gbs with {hardware_file})")
    head_chunk = LITGPT_CHUNK if prof.quantizes_lm_head and model.lm_head_params else 0
    fp = flop_plan(model, setup, dt, run.targets, run.attn, run.loss, quant_head_chunk=head_chunk)
    gemm_kernels, other_kernels, dequant_kernels = fp.kernels
    cls = card_class(acc)
    eff = card_efficiency(acc, GEMM_EFFICIENCY[cls], unverified_figures(acc) is not None)
    kf = dict(opt.corrections)
    u = (opt.gemm_efficiency or eff.fraction) / kf.get("compute", 1.0)
    dev_bw = acc.memory_bandwidth_gbs * 1e9 / max(1, acc.devices_per_package) / kf.get("memory_bound", 1.0)
    bw = dev_bw * BW_EFFICIENCY
    compiled = opt.compiled or setup.compile
    fused = compiled or prof.model_code == "unsloth"
    n = setup.world_size
    wrapper = run.wrapper
    sharded = wrapper.shards_parameters
    deq = dequant_bytes_per_weight(setup, prof.model_code, compiled)
    dequant_kernels *= kernels_per_dequant(setup, prof.model_code, compiled)
    dequant_s = fp.dequant * deq / dev_bw
    k_over = kf.get("overhead", 1.0)
    launch = DISPATCH_SECONDS * (FUSED_OPS if compiled else 1.0) * k_over
    other_kernels = other_kernels * (FUSED_OPS if fused else 1.0)
    # per FSDP unit / ZeRO-3 module: gather, hooks and stream syncs in forward and backward
    unit_s = fsdp_unit_ops(setup) * OP_DISPATCH_SECONDS * model.n_layers * k_over if sharded else 0.0

    # --- optimizer update, once per step (sharded optimizers update 1/n of the states)
    op = optimizer_plan(run.optimizer, pp.trainable_params, pp.trainable_bytes,
                        pp.trainable_tensors, pp.largest_trainable_tensor, pp.factored_elems)
    states = op.states + op.paged
    upd_bytes = pp.trainable_params * (2 * pp.trainable_bytes + pp.trainable_bytes) + 2 * states + op.temp * 2
    if wrapper.shards_optimizer:
        upd_bytes /= n
    optimizer_s = 0.0 if setup.offload != "none" else upd_bytes / bw
    optimizer_launch_s = 0.0
    if setup.offload == "none" and not wrapper.shards_optimizer:
        optimizer_launch_s = max(0.0, optimizer_ops(run.optimizer, pp.trainable_tensors) * OP_DISPATCH_SECONDS
                                 * k_over - optimizer_s)
    host = corrected_link(host_link(acc), kf.get("offload", 1.0))

    # --- collectives
    links: dict[str, str] = {}
    link = stated_link(opt.peer_link, acc, setup.gpus) if opt.peer_link else intra_node_link(acc, setup.gpus)
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
    notes = list(coll.notes)
    gather_s = gathered * ring_factor("all_gather", n) / (link.gbs * 1e9) if sharded else 0.0
    # the part of a collective that cannot hide behind compute: the wrapper's last bucket
    bucket = wrapper.last_bucket_bytes(run, comm_bytes)

    # --- CPU offload over the host link (DeepSpeed ZeRO-Offload / FSDP CPUOffload)
    step_bytes = micro_bytes = cpu_optimizer_s = 0.0
    if setup.offload != "none":
        shard_t = pp.trainable_params / n
        step_bytes = shard_t * (4 + dt.compute)  # fp32 gradients down, 16-bit params up
        if setup.offload == "all":
            micro_bytes = 2 * gathered / n  # parameter shards up for forward and backward
        cpu_optimizer_s = (shard_t * HOST_ADAM_BYTES_PER_PARAM / (HOST_MEMORY_GBS_PER_GPU * 1e9)
                           * kf.get("offload", 1.0))
        notes.append(f"CPU offload: PCIe copies, and the optimizer step on the CPU at "
                     f"{HOST_ADAM_BYTES_PER_PARAM:g} B per parameter of host memory traffic at "
                     f"{HOST_MEMORY_GBS_PER_GPU:g} GB/s per GPU ({cpu_optimizer_s:.2f} s per step)")
    tail = [f"matmuls at {u:.0%} of the {peak:g} TFLOPS dense peak ({cls} class; card throughput {eff.known}: "
            f"{eff.source}), element-wise kernels at {BW_EFFICIENCY:.0%} of {dev_bw / 1e9:g} GB/s"]
    if fused:
        tail.append("fused kernels (torch.compile / Unsloth): element-wise traffic and launches reduced")
    if setup.attn == "eager":
        tail.append("eager attention computes the full s x s scores (no causal skipping)")
    ts = TimeStatics(
        peak=peak, u=u, cls=cls, dev_bw=dev_bw, bw=bw, fused=fused, flops=fp,
        passes=2 + (1 if setup.gradient_checkpointing else 0), weight_bytes=pp.weight_bytes + pp.adapter_bytes,
        grad_bytes=pp.trainable_params * pp.trainable_bytes, traffic_factor=FUSED_TRAFFIC if fused else 1.0,
        gemm_launch=gemm_kernels * launch, other_launch=other_kernels * launch, other_kernels=other_kernels,
        dequant_s=dequant_s, dequant_part=max(dequant_kernels * launch, dequant_s),
        dequant_library=dequant_library(setup, prof.model_code), dequant_s_per_elem=deq / dev_bw, launch=launch,
        launch_s=(gemm_kernels + other_kernels + dequant_kernels) * launch, unit_s=unit_s,
        optimizer_s=optimizer_s, optimizer_launch_s=optimizer_launch_s, paged=op.paged, host=host, links=links, link_gbs=link.gbs,
        per_micro=coll.per_micro_batch, gather_s=gather_s, per_step=coll.per_step, serial=coll.serial,
        bucket=bucket, offload_step_bytes=step_bytes,
        offload_micro_bytes=micro_bytes, cpu_optimizer_s=cpu_optimizer_s, assumptions_head=tuple(notes),
        assumptions_tail=tuple(tail), fixed_s=MICRO_BATCH_FIXED_SECONDS * k_over, card_known=eff.known, link_name=link.name, link_stated=bool(opt.peer_link))
    run.memo["time"] = (acc, opt, ts)
    return ts


def run_step_time(run: Run, acc: Accelerator, options: RuntimeOptions | None = None,
                  memory: MemoryBreakdown | None = None) -> StepTime:
    """Seconds per optimizer step of ``run`` at its own micro-batch, sequence length and accumulation on
    ``acc`` (``memory``: the run's breakdown when the caller has it, for a paged optimizer's spill).
    Raises UnknownThroughput."""
    opt = options or RuntimeOptions()
    ts = time_statics(run, acc, opt)
    setup = run.setup
    ga = setup.grad_accum
    n = setup.world_size
    tokens = setup.batch * setup.seq
    fl = flops_at(ts.flops, setup.seq)
    flops = fl.total
    peak, bw = ts.peak, ts.bw
    assumptions: list[str] = []
    links: dict[str, str] = {}

    # --- one micro-batch on one GPU: each class of kernels takes the longer of its launches and its work
    gemm_s = flops * tokens / (peak * 1e12 * ts.u)
    grad_rw = ts.grad_bytes * (2 if ga > 1 else 1)
    weights_s = (ts.passes * ts.weight_bytes + grad_rw) / bw  # ZeRO-3/FSDP gather the weights: all are read
    matmul_s = max(gemm_s, weights_s)
    elem_s = fl.traffic_bytes * tokens * ts.traffic_factor / bw
    head_elems = fl.dequant_elements - ts.flops.dequant  # a quantized lm_head, rebuilt per chunk
    dequant_s = ts.dequant_s + head_elems * ts.dequant_s_per_elem
    gemm_part = max(ts.gemm_launch, matmul_s)
    other_part = max(ts.other_launch, elem_s)
    dequant_part = ts.dequant_part
    if head_elems:
        head_kernels = 2 * -(-setup.seq // ts.flops.head_chunk)
        dequant_part = max(ts.dequant_part + head_kernels * ts.launch, dequant_s)
    unit_s = ts.unit_s
    micro_s = gemm_part + other_part + dequant_part + unit_s + ts.fixed_s
    gpu_s = matmul_s + elem_s + dequant_s
    if ts.launch_s >= gpu_s:
        bound = "overhead"
    elif matmul_s >= elem_s + dequant_s and gemm_s >= weights_s:
        bound = "compute"
    else:
        bound = "memory"

    optimizer_s = ts.optimizer_s
    paged_s = 0.0
    host = ts.host
    if ts.paged:
        # Paged (unified-memory) states that do not fit next to the step's peak are paged out to the host
        # and back every update (bitsandbytes paged optimizers: cudaMallocManaged).
        if memory is None:
            from tuneplan.estimator.memory import memory_of

            memory = memory_of(run)
        spill = max(0, memory.paged_bytes - max(acc.memory_bytes - memory.device_peak_bytes, 0))
        if spill:
            paged_s = 2 * spill / (host.gbs * 1e9)
            links["host"] = f"{host.name}: {host.gbs:g} GB/s per GPU ({host.source})"
            assumptions.append(f"paged optimizer: {spill / 2**30:.1f} GiB of states do not fit on the card and "
                               "cross the host link twice per step")

    # --- collectives: the part compute does not hide (at least the last bucket)
    links.update(ts.links)
    assumptions.extend(ts.assumptions_head)
    per_micro, per_step, serial = ts.per_micro, ts.per_step, ts.serial
    bwd_share = (fl.backward + fl.recompute) / flops if flops else 0.5
    window = gpu_s if run.wrapper.shards_parameters else gpu_s * bwd_share
    bucket = ts.bucket
    comm_total = ga * per_micro + per_step + serial
    exposed = 0.0
    for amount, count in ((per_micro, ga), (per_step, 1)):
        if amount <= 0:
            continue
        total_bytes = amount * ts.link_gbs * 1e9
        tail = amount * min(1.0, bucket / total_bytes) if total_bytes else 0.0
        exposed += count * max(amount - window, tail)
    exposed += serial

    # --- CPU offload over the host link (DeepSpeed ZeRO-Offload / FSDP CPUOffload)
    offload_s = 0.0
    if setup.offload != "none":
        links["host"] = f"{host.name}: {host.gbs:g} GB/s per GPU ({host.source})"
        offload_s = (ts.offload_step_bytes + ga * ts.offload_micro_bytes) / (host.gbs * 1e9)
        offload_s += ts.cpu_optimizer_s

    if setup.device_map != "none" and setup.gpus > 1:
        # one process over several cards: the hand-overs between them, hidden by nothing (device_map.py)
        from tuneplan.estimator.device_map import copy_seconds

        hand_over_s, links["device_map"] = copy_seconds(run, acc)
        exposed += ga * hand_over_s
        comm_total += ga * hand_over_s
        assumptions.append(f"device_map over {setup.gpus} cards: one works at a time, so the step is one card's "
                           f"for the whole model plus {hand_over_s * 1e3:.3g} ms of copies between cards per "
                           "micro-batch (accelerate's per-module hooks not counted)")
    step_s = ga * micro_s + optimizer_s + ts.optimizer_launch_s + paged_s + exposed + offload_s
    tensor_s = gemm_s if gemm_s >= weights_s else 0.0  # matmuls held by the tensor cores, not by reading weights
    breakdown = {
        "compute": ga * tensor_s,
        "memory_bound": ga * (matmul_s - tensor_s + elem_s + dequant_s) + optimizer_s + paged_s,
        "communication": exposed,
        "offload": offload_s,
        "overhead": ga * (micro_s - gpu_s) + ts.optimizer_launch_s,
    }
    detail = {"dequantization": ga * dequant_s, "optimizer_update": optimizer_s + paged_s,
              "optimizer_launches": ts.optimizer_launch_s,
              "kernel_launches": ga * max(gemm_part + other_part + dequant_part - gpu_s, 0.0),
              "sharded_unit_fixed": ga * unit_s, "micro_batch_fixed": ga * ts.fixed_s}
    if n > 1:
        # Never faster per GPU than the same micro-batches on one GPU: sharding the update saves less than
        # the collectives cost at a fixed per-GPU batch. Paging and offload are left out of the floor
        # (they come from one card's memory, which sharding relieves).
        one = run_step_time(one_gpu_run(run), acc, opt)
        # (and so is a per-tensor optimizer's launch time: sharded optimizers step flat partitions)
        one_launch = one.components.get("optimizer_launches", 0.0) if run.wrapper.shards_optimizer else 0.0
        floor = one.step_seconds - one.components.get("paged_optimizer", 0.0) - one_launch
        if floor > step_s:
            assumptions.append("per-GPU time floored at the single-GPU step (no superlinear scaling)")
            step_s = floor
            breakdown = dict(one.breakdown, memory_bound=one.breakdown["memory_bound"]
                             - one.components.get("paged_optimizer", 0.0),
                             overhead=one.breakdown["overhead"] - one_launch)
            detail = dict(one.breakdown_detail, optimizer_launches=one.breakdown_detail["optimizer_launches"]
                          - one_launch)
    tok_step = tokens * ga * n
    tps_gpu = tokens * ga / step_s
    mfu = (fl.forward + fl.backward) * tokens * ga / (step_s * peak * 1e12)
    components = {
        "matmul": ga * matmul_s, "elementwise": ga * elem_s,
        "dequant": ga * dequant_s, "launch_and_fixed": ga * max(micro_s - gpu_s, 0.0),
        "optimizer": optimizer_s, "optimizer_launches": ts.optimizer_launch_s, "paged_optimizer": paged_s,
        "communication_exposed": exposed,
        "communication_total": comm_total, "offload": offload_s,
    }
    assumptions.extend(ts.assumptions_tail)
    return StepTime(step_seconds=step_s, micro_batch_seconds=micro_s, tokens_per_step=tok_step,
                    tokens_per_second=tps_gpu * n, bound=bound,
                    # a device_map run's cards share one process's work: each is busy 1/cards of the step
                    tokens_per_second_per_gpu=tps_gpu if setup.device_map == "none" else tps_gpu / setup.cards,
                    mfu=mfu if setup.device_map == "none" else mfu / setup.cards,
                    components=components, flops=fl, links=links, assumptions=assumptions,
                    breakdown=breakdown, breakdown_detail=detail, dequant_library=ts.dequant_library,
                    card_known=ts.card_known, link_name=ts.link_name if n > 1 else "", link_stated=ts.link_stated)


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

    forward_seconds: float  # one forward-only micro-batch at the run's shape (no_grad: no backward, no recompute)
    token_seconds: float  # one generated token at batch 1 with a KV cache


def run_eval_time(run: Run, acc: Accelerator, options: RuntimeOptions | None = None) -> EvalTime:
    """Forward-only micro-batch and one decoded token of ``run`` on ``acc``, from the same statics as the step:

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
