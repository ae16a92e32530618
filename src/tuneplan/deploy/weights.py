"""Bytes of the served weights in a format, whole model and per GPU under tensor parallelism.

What each format leaves unquantized (at 16 bits unless said):
- bitsandbytes: every ``nn.Linear`` inside the blocks is quantized, the router included; lm_head and the
  embeddings are not (transformers ``get_keys_to_not_convert``; same rule as the training estimator);
- GPTQ / AWQ: the block linears are quantized; embeddings, lm_head, norms, biases and the MoE router stay
  fp16 (AutoGPTQ/AutoAWQ quantize ``model.layers`` only; vLLM builds the router without a quant method);
- GGUF: see ``tuneplan.deploy.gguf`` (embeddings and output quantized; norms, biases, router in F32).
Tensor parallelism (Megatron-style, as vLLM shards): block linears are split column- or row-wise and the
embedding / lm_head by vocabulary, so each of ``tp`` GPUs holds ``1/tp`` of them; norms (and the router)
are replicated. K/V projections replicated when ``tp`` exceeds the KV heads are ignored (a few MiB).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuneplan.deploy.formats import ServeFormat, linear_bytes
from tuneplan.deploy.gguf import gguf_tensors
from tuneplan.specs.model import ModelSpec

HALF = 2  # fp16/bf16 bytes for everything a format keeps unquantized


@dataclass(frozen=True)
class WeightBytes:
    quantized: int  # block linears (and, for GGUF, embeddings / output) in the format's storage
    unquantized: int  # what stays at 16 bits (GGUF: F32)
    embedding: int  # token-embedding table as stored (read by row lookups, not by a matmul)
    replicated: int  # part of ``unquantized`` each TP rank holds whole (norms, router)
    expert_bytes: int  # routed-expert storage (all experts), for the decode bound's expert reads
    gguf_types: dict[str, int] = field(default_factory=dict)  # GGUF: tensors per type

    @property
    def total(self) -> int:
        return self.quantized + self.unquantized

    def per_gpu(self, tp: int) -> int:
        """Bytes on each of ``tp`` GPUs."""
        sharded = self.total - self.replicated
        return -(-sharded // tp) + self.replicated


def serving_weights(model: ModelSpec, fmt: ServeFormat) -> WeightBytes:
    if fmt.family == "gguf":
        return _gguf(model, fmt)
    layer_norms = sum(spec.norm_params * n for spec, n in model.layer_groups)
    quantized = router = experts = 0
    unquant = HALF * layer_norms
    for spec, n in model.layer_groups:
        for m in spec.linears:
            bias = HALF * m.count * m.d_out if m.bias else 0
            keep_router = m.role == "router" and fmt.family in ("gptq", "awq", "16bit")
            if keep_router or fmt.family == "16bit":
                w = HALF * m.count * m.d_in * m.d_out
                unquant += n * (w + bias)
                if keep_router:
                    router += n * (w + bias)
                elif m.role == "expert":
                    experts += n * w
                continue
            w = m.count * linear_bytes(fmt, m.d_in, m.d_out)
            quantized += n * w
            unquant += n * bias
            if m.role == "expert":
                experts += n * w
    embed_table = HALF * model.vocab * model.hidden
    unquant += HALF * model.params_non_block  # embeddings, lm_head, final norm, other small tensors
    norms = layer_norms + model.final_norm_params
    return WeightBytes(quantized=quantized, unquantized=unquant, embedding=embed_table,
                       replicated=HALF * norms + router, expert_bytes=experts)


def _gguf(model: ModelSpec, fmt: ServeFormat) -> WeightBytes:
    tensors, f32 = gguf_tensors(model, fmt.gguf_ftype or "Q4_K_M")
    types: dict[str, int] = {}
    for t in tensors:
        types[t.gtype] = types.get(t.gtype, 0) + 1
    quantized = sum(t.nbytes for t in tensors)
    embed = next(t.nbytes for t in tensors if t.name == "token_embd")
    experts = sum(t.nbytes for t in tensors if t.name.endswith("_exps"))
    norms = sum(spec.norm_params * n for spec, n in model.layer_groups) + model.final_norm_params
    return WeightBytes(quantized=quantized, unquantized=f32, embedding=embed, replicated=4 * norms,
                       expert_bytes=experts, gguf_types=types)
