"""Stand-ins for GPU kernels the CPU build cannot run, holding exactly the storage the CUDA kernels hold.

On a fake CPU device, transformers' ``sdpa`` would run the CPU flash kernel (own layout copies, head-
expanded GQA gradients) and ``flash_attention_2`` is not installed; neither is the GPU code path. The
stand-ins below are registered as transformers attention functions and keep what the CUDA kernels keep:

- FlashAttention-2 forward (flash-attention ``mha_fwd``; PyTorch vendors the same kernel for SDPA's
  flash backend): output ``[B, S, H, Dv]`` in the input dtype, fp32 log-sum-exp ``[B, H, S]`` and the
  philox RNG state; autograd saves q, k, v, out and the log-sum-exp. K/V stay grouped (native GQA).
- FlashAttention-2 backward (``mha_bwd``): dq, dk, dv, plus ``softmax_d`` fp32 ``[B, H, S_128]`` and
  ``dq_accum`` fp32 ``[B, S_128, H, D_32]`` (sequence rounded up to 128, head dim to 32; 64 above 128...
  256), and for GQA head-expanded ``dk_expanded`` / ``dv_expanded`` ``[B, S, H, D]`` summed into dk / dv.
- Memory-efficient attention (xformers-derived kernel SDPA uses when a mask is present or for fp32):
  output, fp32 log-sum-exp ``[B, H, S_32]``, no GQA (transformers repeats K/V first), backward makes dq,
  dk, dv and an fp32 ``grad_q`` accumulator when the head dim exceeds 128.

transformers' ``sdpa_attention_forward`` calls ``repeat_kv`` only when ``use_gqa_in_sdpa`` is false: a mask
is passed or the head dim exceeds 256 (integrations/sdpa_attention.py); with no padding mask it passes
``enable_gqa=True`` and PyTorch picks the flash backend for 16-bit inputs. Under CUDA autocast SDPA is a
lower-precision op: fp32 q/k/v are cast to the autocast dtype first (the casts are what the kernel saves).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any

import torch

from tuneplan.estimator.saved_tensors import embedding_backward_scratch
from tuneplan.simulate.tracker import Workspace

# Largest internal buffer of each stand-in kernel in the current run (for the workspace table).
KERNEL_BUFFERS: dict[str, int] = {}


def _note(name: str, t: torch.Tensor) -> None:
    n = t.numel() * t.element_size()
    KERNEL_BUFFERS[name] = max(KERNEL_BUFFERS.get(name, 0), n)


def _round(x: int, m: int) -> int:
    return -(-x // m) * m


def _to_kernel_dtype(t: torch.Tensor, fallback: torch.dtype) -> torch.Tensor:
    if torch.is_autocast_enabled("cpu") and t.dtype == torch.float32:
        return t.to(torch.get_autocast_dtype("cpu"))
    if t.dtype == torch.float32 and fallback != torch.float32:
        return t.to(fallback)
    return t


class _FlashAttn(torch.autograd.Function):
    """q, k, v in ``[B, S, H, D]`` (the layout FA2 reads); returns ``[B, S, H, Dv]``."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, s, h, _ = q.shape
        out = torch.empty((b, s, h, v.shape[-1]), dtype=q.dtype, device=q.device)
        lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
        rng = torch.empty((2,), dtype=torch.int64, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse, rng)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v, out, lse, _rng = ctx.saved_tensors
        b, s, h, d = q.shape
        hk = k.shape[2]
        dq = torch.empty_like(q)
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
        s128 = _round(s, 128)
        d_r = _round(d, 32) if d <= 192 else 256
        softmax_d = torch.empty((b, h, s128), dtype=torch.float32, device=q.device)
        dq_accum = torch.empty((b, s128, h, d_r), dtype=torch.float32, device=q.device)
        _note("flash-attn backward: softmax_d fp32 [B,H,S128]", softmax_d)
        _note("flash-attn backward: dq_accum fp32 [B,S128,H,D32]", dq_accum)
        if hk != h:
            dk_exp = torch.empty((b, k.shape[1], h, d), dtype=k.dtype, device=q.device)
            dv_exp = torch.empty((b, v.shape[1], h, v.shape[-1]), dtype=v.dtype, device=q.device)
            _note("flash-attn backward (GQA): dk/dv expanded to all heads, each", dk_exp)
            del dk_exp, dv_exp
        del softmax_d, dq_accum
        return dq, dk, dv


class _MemEffAttn(torch.autograd.Function):
    """Memory-efficient kernel, q/k/v ``[B, H, S, D]`` with equal head counts (K/V already repeated)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, h, s, _ = q.shape
        # output is written [B, S, H, Dv] and returned transposed (aten _efficient_attention_forward)
        out = torch.empty((b, s, h, v.shape[-1]), dtype=q.dtype, device=q.device).transpose(1, 2)
        lse = torch.empty((b, h, _round(s, 32)), dtype=torch.float32, device=q.device)
        seed = torch.empty((2,), dtype=torch.int64, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse, seed)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v, _out, _lse, _seed = ctx.saved_tensors
        dq = torch.empty_like(q)
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
        if q.shape[-1] > 128:
            acc = torch.empty(q.shape, dtype=torch.float32, device=q.device)
            _note("mem-efficient backward: fp32 grad_q accumulator", acc)
            del acc
        return dq, dk, dv


def _n_rep(module: Any) -> int:
    return int(getattr(module, "num_key_value_groups", 1) or 1)


def _repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    if n == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def _weight_dtype(module: Any) -> torch.dtype:
    for p in module.parameters():
        if p.dtype.is_floating_point:
            return p.dtype
    return torch.float32


def sim_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
             **_: Any) -> tuple[Any, None]:
    """transformers ``sdpa`` on a CUDA device, for causal batches without padding (no mask)."""
    q, k, v = (_to_kernel_dtype(t, t.dtype) for t in (query, key, value))
    if q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256:
        out = _FlashAttn.apply(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out, None  # already [B, S, H, D]: the caller's transpose(1, 2).contiguous() is a view
    n = _n_rep(module)
    if n > 1 and q.shape[-1] <= 256:
        # enable_gqa=True but no fused kernel takes it (flash needs 16 bits, the memory-efficient backend
        # has no GQA: sdp_utils.cpp check_batch_size_and_num_heads_dense<false>): SDPA's math backend.
        return _sdpa_math(q, k, v, n), None
    # fp32 without GQA (or head dim > 256, where transformers repeats K/V itself): memory-efficient kernel
    out = _MemEffAttn.apply(q, _repeat_kv(k, n), _repeat_kv(v, n))
    return out.transpose(1, 2), None


def _sdpa_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_rep: int) -> torch.Tensor:
    """aten ``_scaled_dot_product_attention_math`` (attention.cpp), causal, as PyTorch composes it: q and
    k scaled by sqrt(scale) each, K/V ``repeat_interleave``-d for GQA, the B x H x S x S scores, a causal
    additive mask, softmax (saved), ``attn @ v``. Returns ``[B, S, H, Dv]``."""
    s = q.shape[-2]
    factor = q.shape[-1] ** -0.25
    qs = q * factor
    mask = torch.ones((s, s), dtype=torch.bool, device=q.device).tril()
    mask = torch.zeros((s, s), dtype=q.dtype, device=q.device).masked_fill(mask.logical_not(), float("-inf"))
    ke = k.repeat_interleave(n_rep, dim=-3)
    ve = v.repeat_interleave(n_rep, dim=-3)
    attn = torch.matmul(qs, ke.transpose(-2, -1) * factor)
    attn = attn + mask
    attn = torch.softmax(attn, dim=-1)
    return torch.matmul(attn, ve).transpose(1, 2)


def sim_flash(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
              **_: Any) -> tuple[Any, None]:
    """transformers ``flash_attention_2``: fp32 inputs cast to the autocast (or weight) dtype, native GQA."""
    target = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else _weight_dtype(module)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    if q.dtype == torch.float32:
        q, k, v = (t.to(target) for t in (q, k, v))
    d, dv = q.shape[-1], v.shape[-1]
    if dv != d:  # MLA: V padded to the q/k head dim, output cropped (integrations/flash_attention.py)
        v = torch.nn.functional.pad(v, [0, d - dv])
    out = _FlashAttn.apply(q, k, v)
    if dv != d:
        out = out[..., :dv]
    return out, None


ATTENTION_FUNCTIONS = {"tuneplan_sdpa": sim_sdpa, "tuneplan_fa": sim_flash}
ATTN_IMPL = {"sdpa": "tuneplan_sdpa", "flash": "tuneplan_fa", "eager": "eager"}


@contextmanager
def cuda_dropout() -> Any:
    """CUDA's ``dropout`` is the fused ``native_dropout`` (aten/src/ATen/native/Dropout.cpp
    ``is_fused_kernel_acceptable``: CUDA input, 0 < p < 1): it saves a bool mask, 1 B per element. The CPU
    path multiplies by an fp32 noise tensor and saves that (4 B per element); force the CUDA path."""
    import torch.nn.functional as F

    orig = F.dropout

    def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True,
                inplace: bool = False) -> torch.Tensor:
        if not training or p == 0.0:
            return input
        return torch.native_dropout(input, p, True)[0]

    F.dropout = dropout
    try:
        yield
    finally:
        F.dropout = orig


# CUDA autocast's float32 policies (aten/src/ATen/autocast_mode.cpp, the KERNEL_CUDA lists). CPU autocast
# runs these ops in the 16-bit dtype (its fp32 list is losses, linear algebra and FFTs), so the simulated
# step would keep half-size tensors where a GPU keeps fp32 ones. ``fp32``: 16-bit floating inputs are cast
# to fp32 copies and the op runs in fp32 (a LayerNorm saves the fp32 copy of its input).
# ``fp32_set_opt_dtype``: the op is called with ``dtype=torch.float32`` unless the caller gave one (an fp32
# output; softmax reads an fp16 input as it is, a bf16 one through an fp32 copy: ``_HALF_TO_FLOAT`` below).
CUDA_AUTOCAST_FP32 = frozenset({
    "layer_norm", "group_norm", "pow", "__pow__", "__rpow__", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "acos", "asin", "cosh", "sinh", "tan", "erfinv", "softplus", "logsumexp",
    "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "poisson_nll_loss",
    "binary_cross_entropy_with_logits", "cosine_similarity", "cosine_embedding_loss", "hinge_embedding_loss",
    "margin_ranking_loss", "soft_margin_loss", "triplet_margin_loss", "dist", "cdist", "pdist", "renorm",
})
CUDA_AUTOCAST_FP32_SET_DTYPE = frozenset({
    "softmax", "log_softmax", "sum", "cumsum", "cumprod", "prod", "norm",
})
_POLICED = CUDA_AUTOCAST_FP32 | CUDA_AUTOCAST_FP32_SET_DTYPE
_HALF = (torch.float16, torch.bfloat16)


class _CudaAutocastPolicies(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _POLICED and torch.is_autocast_enabled("cpu"):
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None and first.dtype in _HALF:
                if name in CUDA_AUTOCAST_FP32:
                    args = tuple(a.to(torch.float32)
                                 if isinstance(a, torch.Tensor) and a.dtype in _HALF else a
                                 for a in args)
                    kwargs = {k: (v.to(torch.float32)
                                  if isinstance(v, torch.Tensor) and v.dtype in _HALF else v)
                              for k, v in kwargs.items()}
                elif kwargs.get("dtype") is None and not any(isinstance(a, torch.dtype) for a in args):
                    kwargs = {**kwargs, "dtype": torch.float32}
        if name in _HALF_TO_FLOAT:
            fused = _half_to_float(name, args, kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)


# ATen's softmax / log_softmax with dtype=float32 (aten/src/ATen/native/SoftMax.cpp ``softmax``): on CUDA an
# fp16 input runs the half-to-float kernel (``_softmax(input, dim, true)``: one fp32 output, no copy); any
# other input is first converted (``input_.toType(dtype)``). The simulation's fake tensors are CPU tensors,
# for which ATen always converts: an fp16 step would hold an fp32 copy of the scores a GPU never makes.
_HALF_TO_FLOAT = {"softmax": torch._softmax, "log_softmax": torch._log_softmax}


def _half_to_float(name: str, args: Any, kwargs: dict[str, Any]) -> Any:
    """The fused half-to-float call for an fp16 fake input asked in fp32, as on CUDA; None otherwise."""
    from torch._subclasses.fake_tensor import is_fake

    x = args[0] if args else kwargs.get("input")
    dim = args[1] if len(args) > 1 and isinstance(args[1], int) else kwargs.get("dim")
    dtype = kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None))
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float16 or dtype != torch.float32 or dim is None:
        return None
    if not is_fake(x):  # a real CPU tensor: ATen's CPU kernel has no half-to-float path
        return None
    return _HALF_TO_FLOAT[name](x, dim, True)


def modes_follow_recompute() -> tuple[Any, Any]:
    """``torch.utils.checkpoint``'s ``context_fn``: the recomputation of a checkpointed layer runs under the
    simulation's torch-function modes active at its forward (CUDA autocast's fp32 policies above, the
    softmax that keeps its input), which the backward does not see otherwise. On a GPU the recomputation
    re-enters autocast (``_checkpoint_without_reentrant_generator`` restores the device autocast state), so
    CUDA's fp32 list applies to it as to the forward; without this the recomputed layer_norm and softmax of
    GPT-2 / BERT-style layers ran in 16 bits and checkpoint refused the mismatch."""
    from torch.overrides import _get_current_function_mode_stack

    return nullcontext(), _reentered(list(_get_current_function_mode_stack()))


@contextmanager
def _reentered(modes: list[Any]) -> Any:
    from torch.overrides import _get_current_function_mode_stack

    active = _get_current_function_mode_stack()
    with ExitStack() as stack:
        for mode in modes:
            if not any(m is mode for m in active):
                stack.enter_context(mode)
        yield


@contextmanager
def cuda_autocast_policies() -> Any:
    """Give the CPU autocast of the simulated step CUDA autocast's float32 policies (see above)."""
    with _CudaAutocastPolicies():
        yield


class _KeepInput(torch.autograd.Function):
    """Identity that saves its input for backward: the tensor stays alive until the gradient flowing back
    through it has passed the op it feeds, as a saved input of that op would."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _SoftmaxKeepsInput(torch.overrides.TorchFunctionMode):
    # torch < 1.11 derivatives.yaml: _softmax_backward_data(grad, result, dim, self) and the log_softmax
    # twin kept `self` (pytorch/pytorch#64000, fixed by #65242/#66018). cross_entropy runs log_softmax inside
    # one C++ op, so its input (the logits as passed) is held the same way.
    NAMES = frozenset({"softmax", "log_softmax", "cross_entropy"})

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in self.NAMES and args and isinstance(args[0], torch.Tensor) \
                and args[0].requires_grad and torch.is_grad_enabled():
            args = (_KeepInput.apply(args[0]), *args[1:])
        return func(*args, **kwargs)


@contextmanager
def softmax_keeps_input(enabled: bool) -> Any:
    """Make softmax, log_softmax and cross-entropy hold their input for backward (torch < 1.11)."""
    if not enabled:
        yield
        return
    with _SoftmaxKeepsInput():
        yield


def register_attention() -> None:
    from transformers import AttentionInterface

    for name, fn in ATTENTION_FUNCTIONS.items():
        AttentionInterface.register(name, fn)


# ---- workspaces the fake kernels do not allocate ---------------------------------------------------
MIB = 1024**2


def workspace_rule(cublas_bytes: int, tokens: int) -> Any:
    """Kernel-internal buffers, allocated through PyTorch's caching allocator on a GPU:

    - the cuBLAS workspace, allocated once per handle/stream at the first matmul and kept (its size is
      the analytic engine's ``overhead.CUBLAS_WORKSPACE``, one constant in one place);
    - ``embedding_dense_backward`` on CUDA: ``estimator.activations.embedding_backward_scratch`` (the one
      place of that formula).
    """

    def rule(func: Any, args: Any, tracker: Any) -> list[Workspace] | None:
        name = str(func)
        if "mm" in name and ("aten.mm" in name or "aten.addmm" in name or "aten.bmm" in name):
            return [Workspace("cuBLAS workspace", cublas_bytes, "framework", persistent=True)]
        if "embedding_dense_backward" in name:
            hidden = int(args[0].shape[-1])
            return [Workspace("embedding backward: sorted indices, segment offsets, fp32 partial segments",
                              embedding_backward_scratch(tokens, hidden), "backward_temp")]
        return None

    return rule
