"""Run N real training steps on this machine and read memory phase by phase, and the speed.

One optimizer step = ``grad_accum`` micro-batches of random token ids (``batch`` x ``seq``, labels = the
ids), then ``optimizer.step()`` and ``zero_grad(set_to_none=True)`` as the Trainer does (``False`` with
``keep_grads``; ``softmax_keeps_input`` emulated as in simulate). The allocator's peak is reset before
each phase (forward + loss, backward, optimizer step), so the result gives the peak of each phase next to
the overall one; the allocated bytes between phases give the persistent terms:
- before step 1: weights, quantized storage and adapters;
- after a step, gradients freed: + optimizer states (created at step 1) + library workspaces (cuBLAS);
- before ``optimizer.step()``: + the gradients.
Speed: tokens per second over steps 2..N (step 1 builds the optimizer states and warms kernels up);
with one step, over that step, and the result says so.
"""

from __future__ import annotations

import contextlib
import platform
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.measure.build import BuiltRun, build_model, require_stack
from tuneplan.measure.counters import CudaCounters, HostCounters, MemoryCounters, NvmlSampler, open_nvml
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

PHASES = ("forward", "backward", "optimizer_step")


@dataclass
class MeasureResult:
    """A measured run. Byte figures are GPU allocator figures on CUDA, host RSS figures on the CPU."""

    model: str
    setup: dict[str, Any]
    device: str  # "cuda" or "cpu"
    device_name: str
    memory_kind: str  # "cuda" (allocator) or "host" (process RSS)
    memory_metric: str  # what peak_bytes means, in words
    steps: int
    outcome: str = "measured"  # "measured" or "OOM"
    error: str = ""
    trainable_params: int = 0
    peak_bytes: int | None = None  # allocated peak (CUDA) or host RSS peak above baseline
    reserved_peak_bytes: int | None = None
    nvml_device_peak_bytes: int | None = None  # device used above the pre-run reading
    nvml_process_peak_bytes: int | None = None
    phase_peaks: dict[str, int] = field(default_factory=dict)
    persistent_bytes: int | None = None  # before step 1
    after_step_bytes: int | None = None  # after the last step, gradients freed
    gradient_bytes: int | None = None  # before the last optimizer.step minus after_step
    step_seconds: list[float] = field(default_factory=list)
    tokens_per_step: int = 0
    tokens_per_s: float | None = None
    timed_steps: str = ""
    details: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pick_device(torch: Any, device: str) -> str:
    if device not in ("auto", "cuda", "cpu") and not device.startswith("cuda:"):
        raise TuneplanError(f"unknown device {device!r}", field="device", accepted="auto, cuda, cuda:N, cpu")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TuneplanError("no CUDA GPU is visible to torch on this machine", field="device",
                            accepted="cpu (memory figures are then host figures), or run on a GPU machine")
    return device


def run_measure(model: ModelSpec, setup: TrainSetup, *, steps: int = 3, device: str = "auto",
                weights: str | None = None, seed: int = 0) -> MeasureResult:
    """Build ``model`` with ``setup`` (resolved) and run ``steps`` optimizer steps on this machine."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise TuneplanError(f"must be a positive integer, got {steps!r}", field="steps",
                            accepted="1, 2, 3, ...")
    torch, transformers, peft = require_stack()
    dev = pick_device(torch, device)
    torch.manual_seed(seed)
    nvml: NvmlSampler | None = None
    if dev.startswith("cuda"):
        index = torch.device(dev).index or 0
        nvml = open_nvml(torch, index)  # before the first allocation: baseline excludes this process
        torch.cuda.set_device(index)
        counters: MemoryCounters = CudaCounters(torch, index, nvml)
        name = torch.cuda.get_device_name(index)
    else:
        counters = HostCounters()
        name = f"CPU ({platform.processor() or platform.machine()}; no GPU)"
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "peft": peft.__version__}
    if dev.startswith("cuda"):
        versions["cuda"] = str(torch.version.cuda)
        if nvml is not None and nvml.driver:
            versions["driver"] = nvml.driver
    baseline = counters.current() if counters.kind == "host" else 0
    res = MeasureResult(model=model.name, setup=setup.to_dict(),
                        device="cuda" if dev.startswith("cuda") else "cpu",
                        device_name=name, memory_kind=counters.kind, memory_metric=counters.label,
                        steps=steps, versions=versions,
                        tokens_per_step=setup.batch * setup.seq * setup.grad_accum)
    if counters.kind == "host":
        res.notes.append("no GPU: this ran on the CPU and every memory figure is the host process's resident "
                         "memory above its pre-load baseline, not GPU memory; the estimate's comparison is "
                         "indicative only")
    if nvml is None and dev.startswith("cuda"):
        res.notes.append("NVML not available (pip install nvidia-ml-py): no device-level (nvidia-smi) figure")
    built = build_model(model, setup, dev, weights)
    res.trainable_params = built.trainable_params
    res.details = dict(built.details)
    oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers' notices about its own internals
            _loop(torch, built, model, setup, steps, counters, baseline, res)
    except oom as exc:
        res.outcome = "OOM"
        res.error = str(exc).splitlines()[0][:300]
        reached = [v for v in res.phase_peaks.values() if v] + [counters.peak() - baseline]
        res.peak_bytes = max(reached)
        res.notes.append("out of memory: the figures are the peaks reached before the failed allocation")
    if counters.kind == "cuda":  # the reserved pool since the last phase boundary (all of it after an OOM)
        res.reserved_peak_bytes = max(res.reserved_peak_bytes or 0, counters.reserved_peak() or 0)
    if nvml is not None:
        nvml.sample()
        res.nvml_device_peak_bytes = nvml.peak_delta
        res.nvml_process_peak_bytes = nvml.peak_process
    return res


def _loop(torch: Any, run: BuiltRun, model: ModelSpec, setup: TrainSetup, steps: int,
          counters: MemoryCounters, baseline: int, res: MeasureResult) -> None:
    net, opt = run.model, run.optimizer
    vocab = model.vocab
    dev_type = "cuda" if run.device.startswith("cuda") else "cpu"
    amp = (torch.autocast(dev_type, dtype=run.autocast_dtype) if run.autocast_dtype is not None
           else contextlib.nullcontext())
    # torch < 1.11's softmax kept its input: emulated on today's torch with the simulate engine's identity
    # autograd Function that saves the input of softmax / log_softmax / cross_entropy
    from tuneplan.simulate.kernels import softmax_keeps_input
    peaks = dict.fromkeys(PHASES, 0)
    res.phase_peaks = peaks  # the same dict: an OOM part-way keeps the phases already read

    def mark(phase: str) -> None:
        peaks[phase] = max(peaks[phase], counters.peak() - baseline)
        reserved = counters.reserved_peak()
        if reserved is not None:
            res.reserved_peak_bytes = max(res.reserved_peak_bytes or 0, reserved)
        counters.sample_device()
        counters.reset_peak()

    counters.reset_peak()
    res.persistent_bytes = counters.current() - baseline
    for step in range(steps):
        t0 = _now(torch, run.device)
        for _ in range(setup.grad_accum):
            ids = torch.randint(0, vocab, (setup.batch, setup.seq), device=run.device)
            # a classifier takes one label per sequence; a language model, the tokens themselves
            labels = (torch.randint(0, setup.num_labels, (setup.batch,), device=run.device)
                      if setup.num_labels else ids)
            with amp, softmax_keeps_input(setup.softmax_keeps_input):
                out = net(input_ids=ids, labels=labels)
            # The Trainer's compute_loss returns the loss alone (transformers trainer.py, compute_loss ->
            # training_step), so the model output and its logits (batch x seq x vocab in the autocast
            # dtype) are freed before backward; holding them here would add those bytes to its peak.
            loss = out.loss / setup.grad_accum
            del out
            mark("forward")
            (run.scaler.scale(loss) if run.scaler is not None else loss).backward()
            del loss, ids, labels
            mark("backward")
        before_step = counters.current() - baseline
        if run.scaler is not None:
            run.scaler.step(opt)
            run.scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=not setup.keep_grads)  # keep_grads: torch < 2.0's in-place zeroing
        mark("optimizer_step")
        after = counters.current() - baseline
        res.step_seconds.append(_now(torch, run.device) - t0)
        if step == steps - 1:
            res.after_step_bytes = after
            res.gradient_bytes = max(before_step - after, 0)
    res.peak_bytes = max(peaks.values())
    timed = res.step_seconds[1:] if steps > 1 else res.step_seconds
    res.timed_steps = (f"steps 2..{steps}" if steps > 1
                       else "step 1 only (includes warm-up and state creation)")
    total = sum(timed)
    res.tokens_per_s = res.tokens_per_step * len(timed) / total if total > 0 else None


def _now(torch: Any, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter()
