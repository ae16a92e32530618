"""Eager attention's softmax in a checkpointed forward (estimator/eager_forward.py), counted by hand from
transformers 5.25's code at 1 x 1024 tokens on one GPU.

falcon-7b: 71 heads of 64, one K/V head, hidden 4544, fused ``query_key_value`` 4544 -> 4672, LayerNorm,
RoPE. ``eager_attention_forward``: ``matmul(q, k^T) * scaling`` (bf16 under autocast), ``+ mask`` (the
causal mask in the embeddings' dtype), ``softmax(..., dtype=float32)``: a bf16 input is copied to fp32
first (ATen SoftMax.cpp), an fp16 one runs the half-to-float kernel. ``FalconModel.forward`` keeps the
layer below's ``(output, attn_weights)`` bound to ``outputs``: its probabilities, in q's dtype, are live."""

from __future__ import annotations

from typing import Any

from tuneplan.api import build_setup, resolve_run
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.instants import memory_at, named

SEQ = 1024
SCORES = 71 * SEQ * SEQ  # B x H x S x S, b = 1
EAGER_GC = dict(method="lora", seq=SEQ, attn="eager", gradient_checkpointing=True)


def rows(model: str, **setup: Any) -> Any:
    spec = resolve_model(model)
    run = resolve_run(spec, build_setup(spec, **{**EAGER_GC, **setup}))
    return memory_at(run, run.setup.batch, run.setup.seq)


def scores_live(m: Any) -> int:
    """The row's activations beyond the checkpoints."""
    return named(m.rows["forward_attention"]).activations - m.acts.checkpoint_bytes


# per token of the top layer (LoRA, bf16-mixed): LayerNorm's fp32 output under autocast (4 x 4544), the
# fused bf16 projection output FalconAttention keeps bound (2 x 4672), RoPE's bf16 q and k (2 x 72 x 64)
FALCON_PER_TOKEN = 4 * 4544 + 2 * 4672 + 2 * 72 * 64
FALCON_MASK = 2 * SEQ * SEQ  # 1 x 1 x S x S in bf16


def test_falcon_bf16_holds_the_fp32_copy_and_the_layer_below_probabilities() -> None:
    """bf16 masked scores (2) + their fp32 copy (4) + softmax's fp32 output (4) + the layer below's bf16
    probabilities (2): 12 bytes per score."""
    m = rows("tiiuae/falcon-7b")
    assert FALCON_PER_TOKEN == 36_736
    assert scores_live(m) == SCORES * 12 + SEQ * FALCON_PER_TOKEN + FALCON_MASK


def test_falcon_fp16_runs_the_half_to_float_kernel() -> None:
    """fp16: no fp32 copy of the scores, 8 bytes per score."""
    m = rows("tiiuae/falcon-7b", precision="fp16-mixed")
    assert scores_live(m) == SCORES * 8 + SEQ * FALCON_PER_TOKEN + FALCON_MASK


def test_qlora_falcon_holds_fp32_probabilities() -> None:
    """QLoRA (hf: the embeddings upcast to fp32): bitsandbytes returns the projection in its input's dtype,
    LayerNorm's fp32 output, so q is fp32 and ``.to(query.dtype)`` keeps the fp32 softmax output: the layer
    below's is 4 bytes per score; the mask is fp32, so the masked scores are fp32 and softmax makes no copy:
    4 + 4 + 4 = 12 bytes per score. Per token: the norm, the fused output and RoPE's q and k, all fp32."""
    m = rows("tiiuae/falcon-7b", method="qlora")
    per_token = 4 * 4544 + 4 * 4672 + 4 * 72 * 64
    assert scores_live(m) == SCORES * 12 + SEQ * per_token + 4 * SEQ * SEQ


def test_llama_does_not_hold_the_layer_below() -> None:
    """LlamaModel's loop binds only the hidden states: bf16 scores (2) + fp32 copy (4) + output (4) per
    score. Llama-2-7B: 32 heads of 128, MHA (no repeat_kv copy); RMSNorm's bf16 output, bf16 q, k (RoPE)
    and v: (4096 + 3 x 4096) x 2 per token."""
    m = rows("meta-llama/Llama-2-7b-hf")
    scores = 32 * SEQ * SEQ
    assert scores_live(m) == scores * 10 + SEQ * 2 * 4 * 4096 + 2 * SEQ * SEQ


def test_no_instant_without_checkpointing_or_eager() -> None:
    assert "forward_attention" not in rows("tiiuae/falcon-7b", gradient_checkpointing=False).rows
    assert "forward_attention" not in rows("tiiuae/falcon-7b", attn="sdpa").rows


def test_simulate_softmax_of_fp16_runs_half_to_float() -> None:
    """The simulation's CPU fake tensors follow CUDA's ATen ``softmax``: an fp16 input asked in fp32 runs
    ``_softmax(x, dim, half_to_float=True)`` (no fp32 copy of the input: the output's backward leads to
    the fp16 leaf directly), a bf16 one is converted first (a ToCopy node in between)."""
    import pytest

    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tuneplan.simulate.kernels import cuda_autocast_policies

    with FakeTensorMode(), cuda_autocast_policies():
        for dtype, copies in ((torch.float16, False), (torch.bfloat16, True)):
            x = torch.randn(2, 4, 8, 8, dtype=dtype, requires_grad=True)
            y = torch.nn.functional.softmax(x, dim=-1, dtype=torch.float32)
            assert y.dtype == torch.float32
            parent = y.grad_fn.next_functions[0][0]
            assert (type(parent).__name__ == "ToCopyBackward0") is copies
