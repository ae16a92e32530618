"""CUDA autocast's float32 policies (layer_norm, pow, softmax...) in the saved-tensor model and in the
simulate engine's CPU stand-in, and the parallel block's first layer. Expected sizes are counted by hand
from transformers' GPT-2 / GPT-NeoX code (per token, one decoder layer)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.activations import layer_activations
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.profiles import get_profile, resolve_setup


def _layer(name: str, input_requires_grad: bool = True, config: dict | None = None, **setup):
    spec = resolve_model(name, allow_network=False)
    if config:
        spec = replace(spec, config={**spec.config, **config})
    s = resolve_setup(build_setup(spec, **setup), spec)
    dt = resolve_dtypes(s, get_profile("hf"))
    group = spec.layer_groups[0][0]
    return layer_activations(spec, group, s, dt, resolve_targets(spec, s.targets), s.method == "full",
                             s.attn or "sdpa", True, input_requires_grad=input_requires_grad)


def test_gpt2_lora_layer_under_fp16_autocast_by_hand() -> None:
    # fp16 base, fp16 residual stream, autocast. ln_1 / ln_2: fp32 copies of their input (layer_norm is on
    # CUDA autocast's fp32 list) 2 x 4h, + mean/rstd 2 x 8 B. c_attn, attention c_proj, c_fc: lora_A's fp16
    # cast of its input 3 x 2h; q, k, v: views of c_attn's output 3 x 2h; SDPA output 2h and fp32 lse 4a.
    # Residual dropout masks 2 x h. gelu_new: pow's fp32 copy, tanh and (1 + tanh) in fp32, 0.5 * x in fp16:
    # 14 I; MLP c_proj's lora cast 2I. Four LoRA mids 4 x 2r.
    h, inter, a, r = 768, 3072, 12, 16
    la = _layer("openai-community/gpt2", method="lora", seq=512, batch=4, precision="fp16-mixed",
                targets="all-linear", rank=r)
    assert la.per_token == (8 * h + 16 + 3 * 2 * h + 3 * 2 * h + 2 * h + 4 * a + 2 * h + 14 * inter
                            + 2 * inter + 8 * r)


def test_python_gelu_goes_fp32_under_autocast() -> None:
    # Full fine-tune (trained Conv1D layers): F.gelu keeps its fp16 input (2I) and c_proj its fp16 input (2I);
    # gelu_new keeps 14I and c_proj its fp16 cast of the fp32 result (2I): 12I more per token
    kw = dict(method="full", seq=256, batch=1, precision="fp16-mixed")
    new = _layer("openai-community/gpt2", **kw).per_token
    plain = _layer("openai-community/gpt2", config={"activation_function": "gelu"}, **kw).per_token
    assert new - plain == 12 * 3072


def test_parallel_block_first_layer_keeps_no_mlp() -> None:
    # GPT-NeoX (use_parallel_residual): the MLP reads the layer input. In the first LoRA layer that input
    # needs no gradient and the MLP has no adapter: nothing of it is saved, nor its norm's fp32 input copy.
    # A later layer keeps both norms' fp32 copies (2 x 4h + 2 x 8 B stats) and the GELU's input (2I).
    h, inter = 4096, 16384
    kw = dict(method="lora", seq=512, batch=4)
    later = _layer("EleutherAI/pythia-6.9b", **kw).per_token
    first = _layer("EleutherAI/pythia-6.9b", input_requires_grad=False, **kw).per_token
    assert later - first == 2 * 4 * h + 16 + 2 * inter
    # a sequential block (Llama) still runs its MLP on the attention's output: only the first norm differs
    lk = dict(method="lora", seq=512, batch=1)
    seq_later = _layer("meta-llama/Llama-2-7b-hf", **lk).per_token
    seq_first = _layer("meta-llama/Llama-2-7b-hf", input_requires_grad=False, **lk).per_token
    assert seq_later - seq_first == 4 * h + 4  # the first RMSNorm's fp32 copy of its bf16 input, and its rstd


@pytest.mark.slow  # runs a simulated training step
def test_simulate_applies_cuda_fp32_policies() -> None:
    torch = pytest.importorskip("torch")
    from tuneplan.simulate.kernels import cuda_autocast_policies

    x = torch.randn(2, 8, 16).half()
    w = torch.randn(16, 16)
    with torch.autocast("cpu", dtype=torch.float16), cuda_autocast_policies():
        assert torch.nn.functional.layer_norm(x, (16,)).dtype == torch.float32
        assert torch.softmax(x, dim=-1).dtype == torch.float32
        assert torch.pow(x, 3.0).dtype == torch.float32
        assert (x ** 2).dtype == torch.float32
        assert torch.softmax(x, dim=-1, dtype=torch.float16).dtype == torch.float16  # an explicit dtype wins
        assert torch.matmul(x.float(), w).dtype == torch.float16  # lower-precision ops are untouched
    with cuda_autocast_policies():  # no autocast: no policy
        assert torch.nn.functional.layer_norm(x, (16,)).dtype == torch.float16
