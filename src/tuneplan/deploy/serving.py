"""What an inference engine holds besides weights and KV cache: activations and workspaces, per GPU.

- Activations: engines run a forward of up to ``prefill_tokens`` tokens at once (vLLM's
  ``max_num_batched_tokens``, the budget of one scheduler step; chunked prefill keeps long prompts within
  it) and size the KV cache from the peak they observe. Layers run one after another and free their
  intermediates, so the peak is one layer's largest live set per token: the residual and the normed input
  (``2 h``) plus, in attention, q/k/v and the attention output, or, in the MLP, the gate/up output and
  the activation product (``3 f`` gated, ``2 f`` GELU; MoE: ``top_k`` routed experts' widths plus the shared
  expert). Sharded widths divide by ``tp``. The sampler adds fp32 logits and probabilities for the last
  token of each running sequence (``concurrency x vocab x 4 B x 2``). This is the floor of what the
  engine's profiling run sees; engines that upcast or keep extra buffers report more at start-up
  (vLLM logs "PyTorch activation peak memory" and "non_torch_memory"), so read it with its band.
- Workspaces: the CUDA context (the training estimator's constant, ``estimator.overhead``), the cuBLAS
  workspace, and CUDA graphs, which vLLM captures for a range of batch sizes unless ``--enforce-eager``
  (vLLM docs, "Conserving memory": graphs take extra memory). The graph figure is an assumption with a
  wide band, not a calibrated value; tensor parallelism adds NCCL buffers (the training estimator's
  figure is not reused here, they are small beside the rest and not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.estimator.overhead import CUBLAS_WORKSPACE, cuda_context_bytes
from tuneplan.specs.model import ModelSpec

MIB = 1024**2
ACT_BYTES = 2  # fp16/bf16 activations (int4/int8 weight-only kernels compute in 16 bits)
SAMPLER_FP32_COPIES = 2  # logits and probabilities in fp32
CUDA_GRAPHS = 512 * MIB  # assumption: central value for captured graphs' private pools
CUDA_GRAPHS_BAND = (128 * MIB, 1536 * MIB)  # assumption: enforce-eager-like small to large capture sets
ACTIVATION_BAND = (1.0, 3.0)  # the floor above, up to 3x for engines that keep more live (unmeasured)


@dataclass(frozen=True)
class Overheads:
    activations: int
    activation_per_token: int
    sampler: int
    cuda_context: int
    cublas: int
    cuda_graphs: int

    @property
    def workspace(self) -> int:
        return self.cuda_context + self.cublas + self.cuda_graphs


def activation_per_token(model: ModelSpec, tp: int) -> int:
    h = model.hidden
    q_out = model.n_heads * model.head_dim
    kv_out = model.n_kv_heads * model.head_dim
    attn = 2 * h + (q_out + 2 * kv_out + model.n_heads * model.v_head_dim) / tp
    widest = 0.0
    for spec, _ in model.layer_groups:
        f = (spec.expert_intermediate * spec.top_k + spec.mlp_intermediate if spec.moe
             else spec.mlp_intermediate)
        widest = max(widest, (3 if model.mlp_kind == "swiglu" else 2) * f / tp)
    return int(ACT_BYTES * max(attn, 2 * h + widest))


def overheads(model: ModelSpec, *, tp: int, prefill_tokens: int, concurrency: int,
              cuda_graphs: bool = True) -> Overheads:
    per_tok = activation_per_token(model, tp)
    sampler = concurrency * model.vocab * 4 * SAMPLER_FP32_COPIES
    return Overheads(activations=prefill_tokens * per_tok + sampler, activation_per_token=per_tok,
                     sampler=sampler, cuda_context=cuda_context_bytes(), cublas=CUBLAS_WORKSPACE,
                     cuda_graphs=CUDA_GRAPHS if cuda_graphs else 0)
