"""torchtune 0.1's own model, LoRA and single-device recipe loop on fake tensors under tuneplan's storage
tracker: the oracle the analytic ``torchtune-0.2`` profile is held to, next to the published measurement.

Not part of CI and not a dependency: it needs torchtune 0.1.1 and torchao 0.1 beside torch (no GPU), e.g.

    python -m venv --system-site-packages /tmp/tt01venv
    /tmp/tt01venv/bin/pip install --no-deps torchtune==0.1.1 torchao==0.1 omegaconf \\
        antlr4-python3-runtime==4.9.3 sentencepiece tiktoken blobfile datasets multiprocess dill xxhash
    /tmp/tt01venv/bin/python benchmarks/torchtune_oracle.py [ROW_ID ...]

What it reproduces (torchtune 0.1.1 recipes/lora_finetune_single_device.py): the model from torchtune's
own builders (``lora_llama2_7b`` / ``qlora_llama2_7b`` / ``lora_llama3_8b``), adapters trainable only,
activation checkpointing per TransformerDecoderLayer, the loop's ``logits[..., :-1, :].contiguous()``,
``transpose(1, 2)`` and ``CrossEntropyLoss`` with ``logits`` bound until the next iteration, foreach AdamW
over every parameter. torchao's NF4 cannot quantize fake tensors; a stand-in keeps the packed codes and
allocates what torchao 0.1's ``get_original_weight`` allocates in forward and backward (two int64 code
halves, four bf16 half-size temporaries, the bf16 weight). SDPA as PyTorch's flash kernel allocates.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from calibration_rows import load_rows, map_row, resolve_semantic_targets  # noqa: E402
from oracle_common import sdpa  # noqa: E402
from tuneplan.api import estimate  # noqa: E402
from tuneplan.catalog.models import resolve_model  # noqa: E402
from tuneplan.estimator.overhead import CUBLAS_WORKSPACE  # noqa: E402
from tuneplan.simulate.kernels import cuda_dropout, workspace_rule  # noqa: E402
from tuneplan.simulate.tracker import StorageTracker, find_peak  # noqa: E402

_NF4_SIZES: dict[int, int] = {}  # stand-in numel -> the quantized weight's numel


def _to_nf4(w: torch.Tensor) -> torch.Tensor:
    """Packed 4-bit codes plus int8 block scalers, as one bf16-typed buffer of the same bytes (a Parameter
    must be floating); torchao's NF4Tensor also reports a floating dtype."""
    n = w.numel()
    m = n // 4 + n // 128
    _NF4_SIZES[m] = n
    return torch.empty(m, dtype=torch.bfloat16, device=w.device)


def _dequant(w: torch.Tensor, d_in: int) -> torch.Tensor:
    n = _NF4_SIZES[w.numel()]
    halves = [torch.empty(n // 2, dtype=torch.long, device=w.device) for _ in range(2)]
    halves += [torch.empty(n // 2, dtype=torch.bfloat16, device=w.device) for _ in range(4)]
    weight = torch.empty((n // d_in, d_in), dtype=torch.bfloat16, device=w.device)
    del halves
    return weight


class _LinearNF4(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.nf4_weight, ctx.d_in = w, x.shape[-1]  # torchao 0.1 LinearNF4: the weight, not the input
        weight = _dequant(w, x.shape[-1])
        out = F.linear(x, weight)
        del weight
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        weight = _dequant(ctx.nf4_weight, ctx.d_in)
        grad = g @ weight
        del weight
        return grad, None


BUILDERS = {"meta-llama/Llama-2-7b-hf": "llama2_7b", "meta-llama/Meta-Llama-3-8B-Instruct": "llama3_8b"}


def oracle(hf_id: str, method: str, attn_modules: list[str], mlp: bool, batch: int, seq: int, rank: int,
           dropout: float, gc: bool) -> int:
    import importlib

    import torchtune.modules.peft.lora as tl
    from torchtune import modules, utils
    from torchtune.modules.peft.peft_utils import get_adapter_params, set_trainable_params

    tl.to_nf4 = _to_nf4
    tl.linear_nf4 = lambda input, weight: _LinearNF4.apply(input, weight)
    family, size = BUILDERS[hf_id].split("_")
    builder = getattr(importlib.import_module(f"torchtune.models.{family}"),
                      f"{'qlora' if method == 'qlora' else 'lora'}_{family}_{size}")
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    tracker = StorageTracker(workspace_rule(CUBLAS_WORKSPACE, batch * seq))
    torch.set_default_dtype(torch.bfloat16)  # recipe: utils.set_default_dtype(self._dtype)
    try:
        with fake:
            model = builder(lora_attn_modules=attn_modules, apply_lora_to_mlp=mlp, apply_lora_to_output=False,
                            lora_rank=rank, lora_alpha=2 * rank, **({"lora_dropout": dropout}
                                                                   if family == "llama2" else {}))
            set_trainable_params(model, get_adapter_params(model))
            if gc:
                utils.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerDecoderLayer})
    finally:
        torch.set_default_dtype(torch.float32)
    with fake:
        for n, p in model.named_parameters():
            tracker.register(p, "lora_adapters" if "lora_" in n else "weights", op="parameter")
        for _, b in model.named_buffers():
            tracker.register(b, "weights", op="buffer")
    saved_sdpa = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = sdpa
    try:
        with fake, tracker, cuda_dropout():
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
            ids = torch.zeros((batch, seq), dtype=torch.long)
            loss_fn = torch.nn.CrossEntropyLoss()
            logits = None
            for step in (1, 2):
                for micro in range(2):
                    tracker.phase = f"s{step}m{micro}.forward"
                    logits = model(ids)
                    logits = logits[..., :-1, :].contiguous()
                    logits = logits.transpose(1, 2)
                    loss = loss_fn(logits, ids[..., 1:].contiguous()) / 2
                    tracker.phase = f"s{step}m{micro}.backward"
                    loss.backward()
                tracker.phase = f"s{step}.optimizer"
                opt.step()
                opt.zero_grad(set_to_none=True)
            del logits
    finally:
        F.scaled_dot_product_attention = saved_sdpa
    return find_peak(tracker.result()).bytes


ATTN = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "output_proj": "output_proj"}


def main() -> None:
    want = set(sys.argv[1:])
    print(f"{'row':6s} {'model':34s} {'meth':5s} {'metric':9s} {'measured':>9s} {'oracle':>9s} "
          f"{'analytic':>9s}  GiB, allocated (the row's own metric in brackets)")
    for row in load_rows():
        if want and row["row_id"] not in want:
            continue
        m = map_row(row)
        if not hasattr(m, "setup") or m.setup.get("framework") != "torchtune-0.2" or not m.measured_bytes:
            continue
        s = m.setup
        if s["method"] not in ("lora", "qlora") or s.get("gpus", 1) > 1 or m.model not in BUILDERS:
            continue
        text = row["lora_targets"].replace(" ", "")
        attn = [ATTN[t] for t in ("q", "k", "v", "output_proj") if t in text.split("+")[0].split(",")]
        t0 = time.perf_counter()
        orc = oracle(m.model, s["method"], attn, "MLP" in row["lora_targets"], s["batch"], s["seq"],
                     s.get("rank", 8), 0.05, bool(s.get("gradient_checkpointing", True)))
        spec = resolve_model(m.model, allow_network=False)
        s = dict(s)
        if isinstance(s.get("targets"), str) and s["targets"].startswith("sem:"):
            s["targets"] = resolve_semantic_targets(spec, s["targets"])
        b = estimate(spec, **s).breakdown
        ana = b.allocated_peak_bytes
        meas = m.measured_bytes
        print(f"{m.row_id:6s} {m.model[:34]:34s} {s['method']:5s} {m.metric:9s} {meas / 2**30:9.2f} "
              f"{orc / 2**30:9.2f} {ana / 2**30:9.2f}  analytic vs oracle {(ana - orc) / orc:+6.1%} "
              f"(analytic {m.metric} vs measured {(accuracy_quantity(b, m.metric) - meas) / meas:+6.1%}, "
              f"{time.perf_counter() - t0:.0f} s)", flush=True)


def accuracy_quantity(b: Any, metric: str) -> int:
    return b.reserved_peak_bytes if metric == "reserved" else b.allocated_peak_bytes


if __name__ == "__main__":
    main()
