"""Where a short training step's time goes: CPU launch work against GPU kernel time, per op, on this machine.

    python benchmarks/step_profile.py Qwen/Qwen2.5-0.5B --method lora --batch 4 --seq 1024 [--gc] [--steps 6]
    python benchmarks/step_profile.py ... --gc --gc-kwargs preserve_rng_state=false

Builds the model exactly as ``tuneplan measure`` does (random weights from config.json, the same PEFT /
bitsandbytes setup), runs warm steps, then one profiled step (torch.profiler, CPU + CUDA). Prints one JSON
line: the step's wall time, the CPU time the host spent in it, the GPU's kernel time, how many aten ops and
kernels it launched, the host-device synchronizations (each one stops the CPU running ahead of the GPU)
and the ops that took the most CPU time. The time model assumes a step takes the longer of its launches and
its kernels; a step whose wall time is near the sum of the two has the CPU and GPU taking turns.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SYNC_EVENTS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
               "cudaMemcpyAsync", "cudaStreamWaitEvent")


def _gc_kwargs(text: str) -> dict[str, object]:
    out: dict[str, object] = {"use_reentrant": False}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        out[key] = {"true": True, "false": False}.get(value.lower(), value)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--method", default="lora")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--gc", action="store_true", help="gradient checkpointing on")
    ap.add_argument("--gc-kwargs", default="", help="extra torch.utils.checkpoint kwargs, k=v,k=v")
    ap.add_argument("--steps", type=int, default=6, help="warm steps before the profiled one")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from tuneplan.api import estimate
    from tuneplan.measure.build import build_model

    est = estimate(a.model, method=a.method, batch=a.batch, seq=a.seq, gradient_checkpointing=a.gc)
    built = build_model(est.model, est.setup, a.device)
    net, opt = built.model, built.optimizer
    if a.gc and a.gc_kwargs:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs=_gc_kwargs(a.gc_kwargs))
    amp_dtype = built.autocast_dtype
    dev_type = "cuda" if a.device.startswith("cuda") else "cpu"
    sync = torch.cuda.synchronize if dev_type == "cuda" else (lambda: None)

    def step() -> None:
        ids = torch.randint(0, est.model.vocab, (a.batch, a.seq), device=a.device)
        ctx = torch.autocast(dev_type, dtype=amp_dtype) if amp_dtype is not None else torch.autocast(
            dev_type, enabled=False)
        with ctx:
            loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    walls = []
    for _ in range(a.steps):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        walls.append(time.perf_counter() - t0)
    sync()
    c0, t0 = time.process_time(), time.perf_counter()
    step()
    cpu_launch = time.process_time() - c0  # host CPU until the last launch returns (no final sync)
    sync()
    wall = time.perf_counter() - t0
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev_type == "cuda" else [])
    with profile(activities=acts) as prof:
        step()
        sync()
    events = prof.key_averages()
    kernels = [e for e in events if getattr(e, "device_type", None) is not None
               and str(e.device_type).endswith("CUDA")]
    gpu_us = sum(getattr(e, "self_device_time_total", 0) for e in kernels)
    aten = [e for e in events if e.key.startswith("aten::")]
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[: a.top]
    out = {
        "model": a.model, "method": a.method, "batch": a.batch, "seq": a.seq, "gc": a.gc,
        "gc_kwargs": a.gc_kwargs, "warm_step_s": [round(w, 4) for w in walls[1:]],
        "step_wall_s": round(wall, 4), "step_cpu_s": round(cpu_launch, 4),
        "gpu_kernel_s": round(gpu_us / 1e6, 4),
        "aten_ops": sum(e.count for e in aten), "kernels": sum(e.count for e in kernels),
        "syncs": {e.key: e.count for e in events if e.key in SYNC_EVENTS},
        "top_cpu": [[e.key[:60], e.count, round(e.self_cpu_time_total / 1e3, 2)] for e in top],
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
