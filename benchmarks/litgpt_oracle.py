"""LitGPT's own model and LoRA code, run on fake tensors under tuneplan's storage tracker: the oracle the
analytic LitGPT profile is held to, row by row, next to the published measurement.

Not part of CI and not a dependency: it needs LitGPT and Lightning beside torch (no GPU), e.g.

    python -m venv --system-site-packages /tmp/litvenv
    /tmp/litvenv/bin/pip install --no-deps litgpt==0.5.3 lightning==2.4.0
    /tmp/litvenv/bin/pip install --no-deps lightning-utilities jsonargparse torchmetrics
    /tmp/litvenv/bin/python benchmarks/litgpt_oracle.py [ROW_ID ...]

What it reproduces of a LitGPT fine-tune (litgpt finetune/lora.py, full.py ``fit``; Lightning Fabric):
the model built by litgpt (``litgpt.lora.GPT``, fused qkv, untied lm_head); every nn.Linear swapped for a
4-bit stand-in under QLoRA (Fabric ``BitsandbytesPrecision`` converts them all) whose weight dequantizes
to fp16 and is cast to bf16 (Fabric quantizes from ``.half()``) and whose matmul keeps its input in
``ctx.tensors`` (bitsandbytes <= 0.43); SDPA as PyTorch's flash kernel allocates (output ``empty_like``
the transposed query); the module outputs cast to fp32 (Fabric ``convert_output``); the loop's
``logits`` / ``loss`` kept bound until the next micro-batch; ``chunked_cross_entropy``; AdamW (foreach) or
paged AdamW (states outside the allocator). Two micro-batches per step, two steps; the peak over the run
("steady") and over the first micro-batch ("first", for lit-gpt 2023's longest-sample-first runs).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from calibration_rows import load_rows, map_row, resolve_semantic_targets  # noqa: E402
from oracle_common import sdpa  # noqa: E402
from tuneplan.api import estimate  # noqa: E402
from tuneplan.catalog.models import resolve_model  # noqa: E402
from tuneplan.estimator.overhead import CUBLAS_WORKSPACE  # noqa: E402
from tuneplan.simulate.kernels import cuda_dropout, workspace_rule  # noqa: E402
from tuneplan.simulate.qlora import SimLinear4bit  # noqa: E402
from tuneplan.simulate.step import BnbAdamStandIn, relabel_states  # noqa: E402
from tuneplan.simulate.tracker import StorageTracker, find_peak  # noqa: E402


class _MatMul4bitOld(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, w: torch.Tensor, bias: Any, mod: SimLinear4bit) -> torch.Tensor:
        ctx.mod = mod
        ctx.tensors = (a, w)  # bitsandbytes <= 0.43: a Python attribute, alive as long as the graph
        wd = mod.dequantize(torch.float16).to(a.dtype)
        out = F.linear(a, wd, bias)
        del wd
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None, None]:
        wd = ctx.mod.dequantize(torch.float16).to(grad.dtype)
        ga = torch.matmul(grad, wd)
        del wd
        return ga, None, None, None


class _Fabric4bit(SimLinear4bit):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp = x.dtype
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        return _MatMul4bitOld.apply(x.to(self.compute_dtype), self.weight, bias, self).to(inp)


def _quantize_every_linear(model: nn.Module) -> None:
    for mod in list(model.modules()):
        for name, child in list(mod.named_children()):
            if type(child) is nn.Linear:
                setattr(mod, name, _Fabric4bit(child.in_features, child.out_features, child.bias is not None,
                                               torch.bfloat16, torch.bfloat16, False))


def _litgpt_name(hf_id: str) -> str:
    from litgpt.config import configs

    tail = hf_id.split("/")[-1]
    return next(c["name"] for c in configs if c["hf_config"]["name"] == tail)


def oracle(hf_id: str, method: str, targets: str, batch: int, seq: int, rank: int, dropout: float,
           paged: bool) -> tuple[int, int]:
    """(steady peak, first-micro-batch peak) allocated bytes."""
    import litgpt.lora as ll
    import litgpt.model as lm
    from litgpt.utils import chunked_cross_entropy

    t = set(targets.replace(" ", "").split(","))
    lora = method != "full"
    kw = dict(lora_r=rank, lora_alpha=16, lora_dropout=dropout, lora_query="query" in t, lora_key="key" in t,
              lora_value="value" in t, lora_projection="projection" in t, lora_mlp="mlp" in t,
              lora_head="head" in t) if lora else {}
    cfg = (ll.Config if lora else lm.Config).from_name(_litgpt_name(hf_id), **kw)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    tracker = StorageTracker(workspace_rule(CUBLAS_WORKSPACE, batch * seq))
    torch.set_default_dtype(torch.bfloat16)  # Fabric init_module under bf16-true
    try:
        with fake:
            model = (ll.GPT if lora else lm.GPT)(cfg)
            if method == "qlora":
                # the 4-bit layers exist before LoRA marks what trains (lit-gpt's ``quantization()`` and
                # Fabric's ``init_module`` build them in place of nn.Linear), so their biases stay frozen
                _quantize_every_linear(model)
            if lora:
                ll.mark_only_lora_as_trainable(model)
            model.max_seq_length = seq
    finally:
        torch.set_default_dtype(torch.float32)
    with fake:
        for n, p in model.named_parameters():
            tracker.register(p, "lora_adapters" if "lora_" in n else "weights", op="parameter")
            tracker.param_storages.add(p.untyped_storage()._cdata)
        for _, b in model.named_buffers():
            tracker.register(b, "weights", op="buffer")
        for m in model.modules():
            if isinstance(m, SimLinear4bit):
                for q in m.quant_tensors():
                    tracker.register(q, "quant_meta", op="quant_state")
    params = [p for p in model.parameters() if p.requires_grad]
    saved_sdpa = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = sdpa
    try:
        with fake, tracker, cuda_dropout():
            opt = (BnbAdamStandIn(params, bits8=False, paged=True) if paged
                   else torch.optim.AdamW(params, foreach=True))
            ids = torch.zeros((batch, seq), dtype=torch.long)
            logits = loss = None
            for step in (1, 2):
                for micro in range(2):
                    tracker.phase = f"s{step}m{micro}.forward"
                    if lora:  # finetune/lora.py: chunked lm_head, the last chunk shifted
                        logits = [c.to(torch.float32) for c in model(ids, lm_head_chunk_size=128)]
                        logits[-1] = logits[-1][..., :-1, :]
                        loss = chunked_cross_entropy(logits, ids[..., 1:])
                    else:  # finetune/full.py: whole logits, the loss chunks them
                        logits = model(ids).to(torch.float32)
                        loss = chunked_cross_entropy(logits[..., :-1, :], ids[..., 1:])
                    tracker.phase = f"s{step}m{micro}.backward"
                    (loss / 2).backward()
                    for p in params:
                        tracker.relabel(p.grad, "gradients")
                tracker.phase = f"s{step}.optimizer"
                opt.step()
                relabel_states(tracker, opt, False)
                opt.zero_grad(set_to_none=True)
            del logits, loss
    finally:
        F.scaled_dot_product_attention = saved_sdpa
    res = tracker.result()
    return find_peak(res).bytes, find_peak(res, "s1m0.").bytes


def main() -> None:
    want = set(sys.argv[1:])
    print(f"{'row':6s} {'model':34s} {'meth':5s} {'measured':>9s} {'oracle':>9s} {'analytic':>9s}  GiB, "
          "error vs measured")
    for row in load_rows():
        if (want and row["row_id"] not in want) or not row["framework"].startswith(("litgpt", "lit-gpt")):
            continue
        m = map_row(row)
        if not hasattr(m, "setup") or m.outcome != "measured" or not m.measured_bytes:
            continue
        s = dict(m.setup)
        if s["method"] not in ("lora", "qlora", "full") or s.get("gpus", 1) > 1:
            continue
        spec = resolve_model(m.model, allow_network=False)
        if isinstance(s.get("targets"), str) and s["targets"].startswith("sem:"):
            s["targets"] = resolve_semantic_targets(spec, s["targets"])
        t0 = time.perf_counter()
        steady, first = oracle(m.model, s["method"], row["lora_targets"], s["batch"], s["seq"],
                               s.get("rank", 8), s.get("dropout") or 0.05,
                               s.get("optimizer") == "paged-adamw")
        orc = first if s.get("longest_batch_first") else steady
        ana = estimate(spec, **s).breakdown.allocated_peak_bytes
        meas = m.measured_bytes
        print(f"{m.row_id:6s} {m.model[:34]:34s} {s['method']:5s} {meas / 2**30:9.2f} {orc / 2**30:9.2f} "
              f"{ana / 2**30:9.2f}  oracle {(orc - meas) / meas:+6.1%} analytic {(ana - meas) / meas:+6.1%} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
