"""One recommended configuration out of a fit report, with the reason.

Rules, in order (each is a preference, the numbers come from the estimator):
1. Method: among the methods asked (all five unless ``--method``), the most faithful that fits without CPU
   offload, in the order full > LoRA > QLoRA 8-bit > QLoRA 4-bit > freeze (full updates every weight;
   LoRA approximates the update; quantizing the frozen base adds error, 4-bit more than 8-bit;
   freezing all but the last layers trains least). Offload is taken only when nothing else fits:
   it moves the optimizer over PCIe every step (measures.py).
2. Micro-batch: the largest that fits at the user's sequence length such that
   micro-batch x GPUs divides the target global batch, so gradient accumulation reaches it exactly;
   larger micro-batches use the GPU better and need fewer accumulation steps. When the GPUs do not
   divide the target, the nearest global batch at or above it is taken and said so.
3. Gradient accumulation = global / (micro-batch x GPUs). With accumulation > 1 the gradients of
   earlier micro-batches live through the next forward, so the final setup is checked again at its
   own accumulation (and the micro-batch lowered if that no longer fits).
"""

from __future__ import annotations

from typing import Any

from tuneplan.plan.measures import BY_KEY, Prober

PREFERENCE = ("full", "lora", "qlora-8", "qlora-4", "freeze")
LABELS = {"full": "full fine-tuning", "freeze": "freeze-tuning (last layers only)", "lora": "LoRA",
          "qlora-8": "QLoRA 8-bit", "qlora-4": "QLoRA 4-bit"}


def _pick(methods: list[Any]) -> Any | None:
    """The first fitting method in preference order, without offload if any does without."""
    fitting = [m for m in methods if m.fits]
    if not fitting:
        return None
    order = sorted(fitting, key=lambda m: PREFERENCE.index(m.method) if m.method in PREFERENCE else 99)
    no_offload = [m for m in order if "offload" not in m.strategy]
    return (no_offload or order)[0]


def micro_batch_plan(probe: Prober, fields: dict[str, Any], max_batch: int, world: int,
                     global_batch: int) -> tuple[int, int, Any] | None:
    """(micro-batch, accumulation, estimate) reaching ``global_batch``; exact when the GPUs allow."""
    top = min(max_batch, max(1, -(-global_batch // world)))
    for exact in (True, False):
        for b in range(top, 0, -1):
            if exact and global_batch % (b * world):
                continue
            ga = max(1, -(-global_batch // (b * world)))
            est = probe({**fields, "batch": b, "grad_accum": ga})
            if est is not None and est.fits:
                return b, ga, est
    return None


def command(probe: Prober, setup: Any, chosen: Any) -> str:
    """The `tuneplan estimate` line that reproduces the recommendation (user flags + what it switched on)."""
    f = [f"--method {setup.method}"]
    if setup.method == "qlora":
        f.append(f"--bits {setup.quant_bits}")
    if setup.is_lora:
        f.append(f"--rank {setup.rank}")
    f += [f"--batch {setup.batch}", f"--grad-accum {setup.grad_accum}", f"--seq {setup.seq}"]
    if setup.gpus > 1:
        f.append(f"--gpus {setup.gpus}")
    if setup.nodes > 1:
        f.append(f"--nodes {setup.nodes}")
    user = {k: v for k, v in probe.base.items() if k not in ("method", "bits", "rank", "batch", "grad_accum",
                                                                "seq", "gpus", "nodes")}
    measured = {k for m in chosen.requires for k, _ in BY_KEY[m].changes}
    for k, v in user.items():
        if k in measured:
            continue
        flag = "--" + k.replace("_", "-")
        f.append(flag if v is True else f"--no-{flag[2:]}" if v is False else f"{flag} {v}")
    f += [BY_KEY[m].flag for m in chosen.requires]
    return f"tuneplan estimate {probe.model.name} --gpu {probe.gpu.id} " + " ".join(f)


def recommend(probe: Prober, methods: list[Any], *, global_batch: int, user_method: str | None) -> dict[str, Any] | None:
    chosen = _pick(methods)
    if chosen is None:
        return None
    world = int(chosen.setup["gpus"]) * int(chosen.setup["nodes"])
    plan = micro_batch_plan(probe, chosen.fields, chosen.max_batch or 1, world, global_batch)
    if plan is None:
        return None
    b, ga, est = plan
    achieved = b * ga * world
    why = []
    if user_method and len(methods) == 1:
        why.append(f"{LABELS[chosen.method]} as asked")
    else:
        better = [LABELS[m.method] for m in methods if not m.fits and m.method in PREFERENCE
                  and PREFERENCE.index(m.method) < PREFERENCE.index(chosen.method)]
        why.append(f"{LABELS[chosen.method]} is the most faithful method {'asked ' if user_method else ''}that fits"
                   + (f" ({', '.join(better)} does not)" if better else ""))
    if chosen.requires:
        why.append("it needs " + ", ".join(chosen.requires))
    why.append(f"micro-batch {b} is the largest that fits (up to {chosen.max_batch}) and divides the global "
               f"batch over {world} GPU(s)" if achieved == global_batch else
               f"{world} GPU(s) cannot split {global_batch} evenly: global batch {achieved} instead")
    why.append(f"gradient accumulation {ga}: {b} x {ga} x {world} GPU(s) = {achieved} sequences per step")
    why.append(f"{est.headroom_bytes / 2**30:.2f} GiB headroom at that micro-batch")
    return {
        "method": chosen.method,
        "command": command(probe, est.setup, chosen),
        "setup": est.setup.to_dict(),
        "requires": list(chosen.requires),
        "strategy": chosen.strategy,
        "micro_batch": b,
        "grad_accum": ga,
        "world_size": world,
        "global_batch": achieved,
        "target_global_batch": global_batch,
        "device_peak_bytes": est.breakdown.device_peak_bytes,
        "headroom_bytes": est.headroom_bytes,
        "reason": "; ".join(why),
    }
