"""Two optimizer steps in the order the HF Trainer runs them, with the GPU code paths forced.

Per optimizer step (transformers Trainer ``_inner_training_loop`` / ``training_step``): for each of the
``grad_accum`` micro-batches ``outputs = model(**inputs)``, ``loss = outputs.loss`` and ``outputs`` dropped
(so the logits are gone before backward), ``loss.backward()``; then ``clip_grad_norm_(max_norm=1.0)``,
``optimizer.step()``, ``zero_grad(set_to_none=True)`` (``False`` with ``keep_grads``: torch < 2.0). Step 1
creates the optimizer states, so the steady peak is in step 2: that is the step reported.

Optimizers as on CUDA: ``adamw-fused`` is ``AdamW(fused=True)`` (Trainer's ``adamw_torch_fused``, its step
counters live on the device); ``adamw`` is the foreach implementation (torch's CUDA default), whose
counters and bias-correction scalars stay on the host (0-d tensors of the step are not device memory);
8-bit / paged AdamW are a stand-in that allocates bitsandbytes' state layout (``BnbAdamStandIn``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from tuneplan.simulate.tracker import StorageTracker
from tuneplan.specs.setup import TrainSetup

BNB_BLOCK = 256  # bitsandbytes blockwise 8-bit optimizer: one fp32 absmax per 256 elements
BNB_MIN_8BIT = 4096  # min_8bit_size: smaller tensors keep 32-bit states


class BnbAdamStandIn(torch.optim.Optimizer):
    """bitsandbytes AdamW8bit / PagedAdamW(8bit) state layout (bitsandbytes/optim/optimizer.py
    ``Optimizer8bit.init_state``): uint8 ``state1``/``state2`` + fp32 ``absmax1``/``absmax2`` per 256
    elements, or fp32 states for tensors under 4096 elements; paged states are allocated outside
    PyTorch (unified memory) and so are not device allocations: they are reported as paged bytes."""

    def __init__(self, params: Any, bits8: bool, paged: bool) -> None:
        super().__init__(params, {})
        self.bits8, self.paged = bits8, paged
        self.paged_bytes = 0

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    n = p.numel()
                    if self.paged:
                        self.paged_bytes += ((2 * n + 8 * -(-n // BNB_BLOCK))
                                             if (self.bits8 and n >= BNB_MIN_8BIT) else 8 * n)
                        st["step"] = 0
                        continue
                    if self.bits8 and n >= BNB_MIN_8BIT:
                        st["state1"] = torch.empty_like(p, dtype=torch.uint8)
                        st["state2"] = torch.empty_like(p, dtype=torch.uint8)
                        st["absmax1"] = torch.empty(-(-n // BNB_BLOCK), dtype=torch.float32, device=p.device)
                        st["absmax2"] = torch.empty(-(-n // BNB_BLOCK), dtype=torch.float32, device=p.device)
                    else:
                        st["state1"] = torch.empty_like(p, dtype=torch.float32)
                        st["state2"] = torch.empty_like(p, dtype=torch.float32)
                    st["step"] = 0
                st["step"] += 1  # the update kernel works in place


class HfAdamWLoop(torch.optim.Optimizer):
    """The memory behaviour of transformers.optimization.AdamW (``adamw_hf``): in-place moment updates
    and one ``sqrt`` temporary per parameter, one parameter at a time."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, {"lr": 1e-5, "eps": 1e-6})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                st["exp_avg"].mul_(0.9).add_(p.grad, alpha=0.1)
                st["exp_avg_sq"].mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                denom = st["exp_avg_sq"].sqrt().add_(group["eps"])
                p.addcdiv_(st["exp_avg"], denom, value=-group["lr"])
                del denom


def trainer_param_groups(model: nn.Module) -> list[dict[str, Any]]:
    """The parameter groups ``Trainer.create_optimizer`` hands the optimizer (transformers trainer.py): the
    trainable parameters named by ``Trainer.get_decay_parameter_names`` (all but biases and norms), then the
    others, each in ``named_parameters()`` order; an empty group left out. The order decides what an
    optimizer that walks its tensors one by one (Adafactor) holds at once."""
    from transformers import Trainer

    decay = set(Trainer.get_decay_parameter_names(None, model))  # reads only its ``model`` argument
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [[p for n, p in named if n in decay], [p for n, p in named if n not in decay]]
    return [{"params": g, "weight_decay": 0.0} for g in groups if g]


def make_optimizer(name: str, params: list[Any]) -> torch.optim.Optimizer:
    if not params:
        raise ValueError("no trainable parameters")
    if name == "adamw-fused":
        return torch.optim.AdamW(params, lr=1e-5, fused=True)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-5, foreach=True)
    if name == "adamw-hf":
        return HfAdamWLoop(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-5)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-5, scale_parameter=False, relative_step=False)
    if name in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw"):
        return BnbAdamStandIn(params, bits8="8bit" in name, paged=name.startswith("paged"))
    raise ValueError(name)


def relabel_states(tracker: StorageTracker, opt: torch.optim.Optimizer, fused: bool) -> None:
    for st in opt.state.values():
        for k, v in st.items():
            if not isinstance(v, torch.Tensor):
                continue
            if k == "step" and not fused:
                tracker.untrack(v)
            else:
                tracker.relabel(v, "optimizer_states")



def training_labels(setup: TrainSetup, ids: torch.Tensor) -> torch.Tensor:
    """The labels a step trains on: the input ids for a language-model head; for transformers' sequence
    classifiers one class index per sample, or one float target for a single-label regression head (reward
    models), which it trains with MSELoss."""
    if not setup.num_labels:
        return ids
    return (torch.zeros((setup.batch,), dtype=torch.long) if setup.num_labels > 1
            else torch.zeros((setup.batch,), dtype=torch.float32))


def run_steps(model: nn.Module, setup: TrainSetup, optimizer: str, tracker: StorageTracker, half: torch.dtype,
              autocast: bool, progress: Callable[[float, str], None] | None = None, steps: int = 2,
              no_sync: Callable[[], Any] | None = None, on_step: Callable[[int], None] | None = None,
              outputs_until_step: bool = False, trainer_groups: bool = False) -> Any:
    """``no_sync``: the wrapper's context for the accumulating micro-batches (the Trainer runs every
    micro-batch but the last of a step under ``accelerator.no_sync(model)``: transformers
    ``_inner_training_loop``; DeepSpeed excepted). ``on_step(step)``: called as each step's first forward
    begins (DDP's bucket rebuild). ``outputs_until_step``: the loop keeps each micro-batch's outputs until
    the optimizer step has run (fsdp_qlora train.py: ``output = None`` after the step), not the Trainer's.
    ``trainer_groups``: the optimizer steps the Trainer's two parameter groups (:func:`trainer_param_groups`)
    instead of one."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(optimizer, trainer_param_groups(model) if trainer_groups else params)
    fused = optimizer == "adamw-fused"
    tracker.host_scalars_in_optimizer = not fused
    ids = torch.zeros((setup.batch, setup.seq), dtype=torch.long)
    labels = training_labels(setup, ids)
    total = steps * (setup.grad_accum * 2 + 1)
    done = 0

    def tick(msg: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done / total, msg)

    amp = (lambda: torch.autocast("cpu", dtype=half)) if autocast else nullcontext
    kept: list[Any] = []
    for step in range(1, steps + 1):
        for micro in range(setup.grad_accum):
            tracker.phase = f"step{step}.forward"
            tracker.micro = micro
            if on_step is not None and micro == 0:
                on_step(step)
            sync = no_sync() if (no_sync is not None and micro < setup.grad_accum - 1) else nullcontext()
            with sync:
                with amp():
                    outputs = model(input_ids=ids, labels=labels)
                loss = outputs.loss
                kept.append(outputs if outputs_until_step else None)
                del outputs  # Trainer.compute_loss returns the loss only: the logits die here
                if setup.grad_accum > 1:
                    loss = loss / setup.grad_accum
                tick(f"step {step} forward {micro + 1}/{setup.grad_accum}")
                tracker.phase = f"step{step}.backward"
                loss.backward()
                del loss
            for p in params:
                tracker.relabel(p.grad, "gradients")
            if micro < setup.grad_accum - 1:
                # an accumulating micro-batch's outputs go at its end, the last one's after the step
                kept.clear()
            tick(f"step {step} backward {micro + 1}/{setup.grad_accum}")
        tracker.phase = f"step{step}.optimizer"
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        relabel_states(tracker, opt, fused)
        tracker.phase = f"step{step}.zero_grad"
        opt.zero_grad(set_to_none=not setup.keep_grads)
        kept.clear()
        tick(f"step {step} optimizer")
    return opt
