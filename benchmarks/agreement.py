"""Analytic engine vs the simulate oracle: relative difference of the allocated peak and of each component
(and, in each record, of the reserved peak: the analytic segment model against the allocator emulation).

    python benchmarks/agreement.py               # full sweep (about 40 cases), 2 worker processes
    python benchmarks/agreement.py --quick       # the CI subset (also run by
                                                   tests/test_simulate_agreement.py)
    python benchmarks/agreement.py --markdown    # table for the README
    python benchmarks/agreement.py --only 70b    # cases whose label contains "70b"
    python benchmarks/agreement.py --only "mg "  # the multi-GPU cases (rank 0 of an FSDP1 job)
    python benchmarks/agreement.py --random 300 --seed 1 --jobs 2   # random valid setups (random_setups.py)

Target: analytic within 3% of simulate on every case, 1% median. Component differences are shown in
percent of the simulated peak (a component's own relative error is meaningless when it is tiny).
``layers`` overrides num_hidden_layers where a case only needs the per-layer model (the analytic engine
and the simulation read the same reduced config, so the comparison stays exact); the timing cases run
the full depth. Seconds per case are the simulation's own (model build + two steps), not the imports.

``--random N`` draws N valid setups over the whole setup space instead (``random_setups.py``: every catalog
model at 2-4 layers, every method, strategy, world size 1-8, framework profile, precision, optimizer...)
and prints the share within 3 %, the worst cases and, per axis, where the disagreement concentrates.
A setup the simulation cannot run is skipped and counted with the simulation's own reason.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

GIB = 1024**3


@dataclass(frozen=True)
class Case:
    label: str
    model: str
    setup: dict[str, Any]
    layers: int | None = None
    quick: bool = False
    tags: tuple[str, ...] = field(default_factory=tuple)


Q05 = "Qwen/Qwen2.5-0.5B"  # tied embeddings, GQA 14/2, vocab 151936
Q7 = "Qwen/Qwen2.5-7B-Instruct"  # untied, GQA 28/4, q/k/v biases
L1 = "meta-llama/Llama-3.2-1B"  # tied, GQA 32/8, vocab 128256
L27 = "meta-llama/Llama-2-7b-hf"  # untied, MHA, vocab 32000
GEM = "google/gemma-2b"  # head_dim 256, multi-query (1 KV head), vocab 256000, GeGLU
MIX = "mistralai/Mixtral-8x7B-v0.1"  # MoE 8 experts, top-2
Q3MOE = "Qwen/Qwen3-30B-A3B"  # MoE 128 experts, top-8, q/k norms
PHI3 = "microsoft/Phi-3-mini-4k-instruct"  # fused qkv_proj and gate_up_proj
L70 = "meta-llama/Llama-3.1-70B-Instruct"
GPT2 = "openai-community/gpt2"  # LayerNorm, GELU (python gelu_new), Conv1D, dropout 0.1 everywhere
PHI2 = "microsoft/phi-2"  # parallel attention + MLP, one LayerNorm per block, biases
NEOX = "EleutherAI/pythia-6.9b"  # GPT-NeoX: fused query_key_value, parallel residual
BERT = "google-bert/bert-large-uncased"  # encoder: eager softmax in the compute dtype, MLM / classifier heads

CASES: list[Case] = [
    # dense, tied, GQA: every method x checkpointing x attention
    Case("q0.5b full sdpa", Q05, dict(method="full", seq=1024), quick=True),
    Case("q0.5b full sdpa gc", Q05, dict(method="full", seq=1024, gradient_checkpointing=True)),
    Case("q0.5b full eager", Q05, dict(method="full", seq=512, attn="eager")),
    Case("q0.5b full eager gc", Q05, dict(method="full", seq=512, attn="eager", gradient_checkpointing=True)),
    Case("q0.5b full flash bf16", Q05, dict(method="full", seq=1024, attn="flash", precision="bf16")),
    Case("q0.5b full adamw-foreach", Q05, dict(method="full", seq=1024, optimizer="adamw")),
    Case("q0.5b full ga2", Q05, dict(method="full", seq=1024, grad_accum=2)),
    Case("q0.5b full fp32", Q05, dict(method="full", seq=512, precision="fp32"), layers=8),
    Case("q0.5b lora fp32 (sdpa math path)", Q05, dict(method="lora", seq=1024, precision="fp32"), layers=8),
    Case("q0.5b lora sdpa", Q05, dict(method="lora", seq=1024), quick=True),
    Case("q0.5b lora eager", Q05, dict(method="lora", seq=512, attn="eager"), quick=True),
    Case("q0.5b lora flash gc", Q05, dict(method="lora", seq=2048, attn="flash",
                                          gradient_checkpointing=True)),
    Case("q0.5b lora all-linear gc", Q05, dict(method="lora", seq=1024, targets="all-linear",
                                               gradient_checkpointing=True)),
    Case("q0.5b lora bf16 dropout", Q05, dict(method="lora", seq=1024, precision="bf16", dropout=0.05)),
    Case("q0.5b lora fp16-mixed", Q05, dict(method="lora", seq=1024, precision="fp16-mixed")),
    Case("q0.5b lora b4 s8192 (logits)", Q05, dict(method="lora", batch=4, seq=8192,
                                                   gradient_checkpointing=True), layers=6),
    Case("q0.5b qlora gc", Q05, dict(method="qlora", seq=1024), quick=True),
    Case("q0.5b qlora eager nogc", Q05, dict(method="qlora", seq=512, attn="eager",
                                             gradient_checkpointing=False)),
    Case("q0.5b freeze", Q05, dict(method="freeze", seq=1024)),
    # dense, untied, GQA, biases
    Case("q7b full sdpa", Q7, dict(method="full", seq=2048), layers=4),
    Case("q7b full gc", Q7, dict(method="full", seq=2048, gradient_checkpointing=True), layers=6),
    Case("q7b full gc s8192 (autocast cache)", Q7, dict(method="full", seq=8192, gradient_checkpointing=True),
         layers=4),
    Case("q7b lora sdpa", Q7, dict(method="lora", seq=2048), layers=6),
    Case("q7b lora eager gc", Q7, dict(method="lora", seq=1024, attn="eager",
                                       gradient_checkpointing=True), layers=6),
    Case("q7b lora b4 s512", Q7, dict(method="lora", batch=4, seq=512), layers=6),
    Case("q7b qlora gc s2048 (issue)", Q7, dict(method="qlora", seq=2048, gradient_checkpointing=True),
         tags=("timing",)),
    Case("q7b qlora nogc flash", Q7, dict(method="qlora", seq=2048, attn="flash",
                                          gradient_checkpointing=False), layers=6),
    Case("q7b qlora gc s8192 (logits)", Q7, dict(method="qlora", seq=8192,
                                                 gradient_checkpointing=True), layers=4),
    Case("q7b qlora no-dq", Q7, dict(method="qlora", seq=1024, double_quant=False), layers=4),
    # tied, GQA 32/8, other vocab
    Case("l1b full sdpa", L1, dict(method="full", seq=2048), layers=6),
    Case("l1b lora gc", L1, dict(method="lora", seq=4096, gradient_checkpointing=True), layers=6),
    # MHA, untied
    Case("l2-7b lora eager", L27, dict(method="lora", seq=1024, attn="eager"), layers=4),
    Case("l2-7b qlora gc", L27, dict(method="qlora", seq=4096), layers=4),
    # Gemma: head_dim 256, multi-query
    Case("gemma2b lora sdpa", GEM, dict(method="lora", seq=1024), layers=4),
    Case("gemma2b full eager", GEM, dict(method="full", seq=512, attn="eager"), layers=4),
    Case("gemma2b qlora gc", GEM, dict(method="qlora", seq=2048), layers=4),
    # MoE (grouped experts)
    Case("mixtral lora gc", MIX, dict(method="lora", seq=1024, gradient_checkpointing=True), layers=2),
    Case("mixtral full bf16", MIX, dict(method="full", seq=512, precision="bf16"), layers=2),
    Case("qwen3-moe lora", Q3MOE, dict(method="lora", seq=512), layers=2),
    # fused projections
    Case("phi3-mini lora (fused qkv)", PHI3, dict(method="lora", seq=1024), layers=4),
    Case("phi3-mini full", PHI3, dict(method="full", seq=512), layers=4),
    # full depth, timing
    Case("l70b qlora gc s2048 (timing)", L70, dict(method="qlora", seq=2048), tags=("timing",)),
    # classic GPT blocks: LayerNorm (native kernel keeps no output), model-config dropout masks
    Case("gpt2 full eager fp32 (dropout 0.1)", GPT2, dict(method="full", seq=512, batch=4, attn="eager",
                                                          precision="fp32")),
    Case("gpt2 full sdpa", GPT2, dict(method="full", seq=512, batch=4)),
    Case("phi-2 full sdpa", PHI2, dict(method="full", seq=512, batch=4), layers=4),
    Case("pythia-6.9b lora sdpa", NEOX, dict(method="lora", seq=512, batch=4), layers=4),
    # CUDA autocast's fp32 policies (layer_norm, pow, softmax) on a 16-bit residual stream / a python GELU
    Case("gpt2 lora fp16-mixed (autocast LayerNorm)", GPT2, dict(method="lora", seq=512, batch=4,
                                                                 precision="fp16-mixed",
                                                                 targets="all-linear")),
    Case("phi-2 lora sdpa (parallel block)", PHI2, dict(method="lora", seq=512, batch=4), layers=4),
    # encoders and sequence-classification heads (num_labels), torch < 2.0's kept gradients
    Case("bert-large classifier fp16-mixed eager", BERT, dict(method="full", seq=512, batch=4, attn="eager",
                                                              precision="fp16-mixed",
                                                              num_labels=2), quick=True),
    Case("bert-large classifier fp32 keep-grads", BERT, dict(method="full", seq=512, batch=4, attn="eager",
                                                             precision="fp32", num_labels=2,
                                                             keep_grads=True)),
    Case("bert-large mlm lora", BERT, dict(method="lora", seq=512, batch=2, attn="eager",
                                           targets="all-linear")),
    Case("l1b reward qlora gc (num_labels 1)", L1, dict(method="qlora", seq=1024, batch=2, num_labels=1,
                                                        gradient_checkpointing=True), layers=4),
    Case("q0.5b full fp32 gc keep-grads", Q05, dict(method="full", seq=512, precision="fp32",
                                                    gradient_checkpointing=True, keep_grads=True), layers=8),
    # torch < 1.11: softmax / log_softmax / cross-entropy hold their input for backward
    Case("bert-large classifier fp16-mixed softmax-keeps-input", BERT, dict(
        method="full", seq=512, batch=4, attn="eager", precision="fp16-mixed", num_labels=2,
        softmax_keeps_input=True), layers=3),
    Case("q0.5b lora eager softmax-keeps-input", Q05, dict(method="lora", seq=512, attn="eager",
                                                           softmax_keeps_input=True), layers=8, quick=True),
    Case("gpt2 full fp16-mixed eager softmax-keeps-input", GPT2, dict(
        method="full", seq=512, batch=4, attn="eager", precision="fp16-mixed", softmax_keeps_input=True)),
    # MoE "all-linear": transformers 5 fused experts and TopK routers are not nn.Linear, PEFT skips them
    Case("mixtral lora all-linear gc", MIX, dict(method="lora", seq=512, targets="all-linear",
                                                 gradient_checkpointing=True), layers=2),
    Case("qwen3-moe lora all-linear gc", Q3MOE, dict(method="lora", seq=512, targets="all-linear",
                                                     gradient_checkpointing=True), layers=2),
    # MoE QLoRA: bitsandbytes quantizes only nn.Linear; the fused experts and routers stay 16-bit (then fp32)
    Case("qwen3-moe qlora (experts unquantized)", Q3MOE, dict(method="qlora", seq=512), layers=2),
    Case("mixtral qlora mlp (LoRA'd fp32 expert stacks)", MIX, dict(method="qlora", seq=512, targets="mlp",
                                                                    precision="bf16"), layers=2),
]

# Several GPUs: rank 0 of an FSDP1 job (the real FullyShardedDataParallel on a fake process group, configured
# as the HF Trainer does). Labels start with "mg " (--only "mg "). DeepSpeed ZeRO does not run on a fake
# process group on the CPU build (docs/simulate.md), so it has no case here.
FSDP = dict(fsdp=True)
MULTI_GPU: list[Case] = [
    Case("mg fsdp1 ws2 full q0.5b", Q05, dict(method="full", seq=1024, gpus=2, **FSDP), layers=4),
    Case("mg fsdp1 ws4 full q0.5b gc", Q05, dict(method="full", seq=1024, gpus=4, gradient_checkpointing=True,
                                                 **FSDP), layers=4),
    Case("mg fsdp1 ws8 full q0.5b ga2", Q05, dict(method="full", seq=1024, gpus=8, grad_accum=2,
                                                  **FSDP), layers=4),
    Case("mg fsdp1 ws2 full q0.5b bf16", Q05, dict(method="full", seq=1024, gpus=2, precision="bf16",
                                                   **FSDP), layers=4),
    Case("mg fsdp1 ws4 full q0.5b offload", Q05, dict(method="full", seq=1024, gpus=4, offload="all",
                                                      **FSDP), layers=4),
    Case("mg fsdp1 ws2 lora q0.5b", Q05, dict(method="lora", seq=1024, gpus=2, **FSDP), layers=4),
    Case("mg fsdp1 ws4 lora q0.5b gc", Q05, dict(method="lora", seq=1024, gpus=4, gradient_checkpointing=True,
                                                 **FSDP), layers=4),
    Case("mg fsdp1 ws8 lora q0.5b all-linear", Q05, dict(method="lora", seq=1024, gpus=8,
                                                         targets="all-linear", **FSDP), layers=4),
    Case("mg fsdp1 ws2 lora q0.5b offload", Q05, dict(method="lora", seq=1024, gpus=2, offload="all",
                                                      **FSDP), layers=4),
    Case("mg fsdp1 ws2 qlora q0.5b", Q05, dict(method="qlora", seq=1024, gpus=2,
                                               **FSDP), layers=4, tags=("ci",)),
    Case("mg fsdp1 ws4 qlora q0.5b nogc", Q05, dict(method="qlora", seq=1024, gpus=4,
                                                    gradient_checkpointing=False, **FSDP), layers=4),
    Case("mg fsdp1 ws8 qlora q0.5b", Q05, dict(method="qlora", seq=1024, gpus=8, **FSDP), layers=4),
    Case("mg fsdp1 ws2 qlora q0.5b offload", Q05, dict(method="qlora", seq=1024, gpus=2, offload="all",
                                                       **FSDP), layers=4),
    Case("mg fsdp1 ws2 full l1b", L1, dict(method="full", seq=1024, gpus=2, **FSDP), layers=4),
    Case("mg fsdp1 ws4 lora l1b gc", L1, dict(method="lora", seq=2048, gpus=4, gradient_checkpointing=True,
                                              **FSDP), layers=4),
    Case("mg fsdp1 ws8 qlora l1b", L1, dict(method="qlora", seq=2048, gpus=8, **FSDP), layers=4),
    Case("mg fsdp1 ws2 lora l2-7b bf16 gc", L27, dict(method="lora", seq=2048, gpus=2, precision="bf16",
                                                     gradient_checkpointing=True, **FSDP), layers=3),
    Case("mg fsdp1 ws2 qlora l2-7b bf16 ga2 flash", L27, dict(method="qlora", seq=2048, batch=2, gpus=2,
                                                              precision="bf16", grad_accum=2, attn="flash",
                                                              targets="all-linear", **FSDP), layers=3),
    Case("mg fsdp1 ws2 qlora l2-7b offload", L27, dict(method="qlora", seq=2048, gpus=2, offload="all",
                                                       **FSDP), layers=3),
    Case("mg fsdp1 ws8 full l2-7b gc", L27, dict(method="full", seq=2048, gpus=8, gradient_checkpointing=True,
                                                 **FSDP), layers=3),
    Case("mg fsdp1 ws4 qlora l70b all-linear", L70, dict(method="qlora", seq=2048, batch=2, gpus=4,
                                                         precision="bf16", targets="all-linear", attn="flash",
                                                         **FSDP), layers=2),
    Case("mg fsdp1 ws2 qlora l70b offload", L70, dict(method="qlora", seq=2048, batch=2, gpus=2,
                                                      precision="bf16", targets="all-linear", offload="all",
                                                      **FSDP), layers=2),
    Case("mg fsdp1 ws8 lora l70b", L70, dict(method="lora", seq=2048, gpus=8, gradient_checkpointing=True,
                                             **FSDP), layers=2),
]
# FSDP2: the real fully_shard on a fake process group, grouped as accelerate's fsdp2_prepare_model does
F2 = dict(fsdp=True, fsdp_version=2)
MULTI_GPU += [
    Case("mg fsdp2 ws2 full q0.5b", Q05, dict(method="full", seq=1024, gpus=2, **F2), layers=4),
    Case("mg fsdp2 ws4 full q0.5b gc", Q05, dict(method="full", seq=1024, gpus=4, gradient_checkpointing=True,
                                                 **F2), layers=4),
    Case("mg fsdp2 ws8 full q0.5b s256 (tied head grads)", Q05, dict(method="full", seq=256, gpus=8,
                                                                     **F2), layers=6),
    Case("mg fsdp2 ws2 full q0.5b ga2", Q05, dict(method="full", seq=512, gpus=2, grad_accum=2,
                                                  **F2), layers=4),
    Case("mg fsdp2 ws4 full l1b bf16 s512", L1, dict(method="full", seq=512, gpus=4, precision="bf16",
                                                     **F2), layers=6),
    Case("mg fsdp2 ws2 full l2-7b bf16", L27, dict(method="full", seq=1024, gpus=2, precision="bf16",
                                                   **F2), layers=6),
    Case("mg fsdp2 ws2 lora q0.5b", Q05, dict(method="lora", seq=1024, gpus=2, **F2), layers=4),
    Case("mg fsdp2 ws4 lora q0.5b all-linear gc", Q05, dict(method="lora", seq=1024, gpus=4,
                                                            targets="all-linear", gradient_checkpointing=True,
                                                            **F2), layers=4),
    Case("mg fsdp2 ws2 lora l2-7b gc", L27, dict(method="lora", seq=2048, gpus=2, gradient_checkpointing=True,
                                                 **F2), layers=3),
    Case("mg fsdp2 ws2 qlora q0.5b", Q05, dict(method="qlora", seq=1024, gpus=2,
                                               **F2), layers=4, tags=("ci",)),
    Case("mg fsdp2 ws8 qlora l1b", L1, dict(method="qlora", seq=2048, gpus=8, **F2), layers=4),
    Case("mg fsdp2 ws4 qlora l70b all-linear", L70, dict(method="qlora", seq=2048, batch=2, gpus=4,
                                                         precision="bf16", targets="all-linear", attn="flash",
                                                         **F2), layers=2),
]
# FSDP coverage: world sizes 2, 4 and 8 for FSDP1 and FSDP2, with and without CPU offload (FSDP1
# CPUOffload(offload_params=True), FSDP2 CPUOffloadPolicy), full, LoRA and QLoRA; loss-dominated (Qwen2.5's
# 152k vocabulary) and layer-dominated (Llama-2-7B's wide layers) peaks
OFF = dict(offload="all")
MULTI_GPU += [
    # LLaMA-Factory's pure_bf16 turns the Trainer's bf16 off: no MixedPrecision, no fp32 upcast
    Case("mg fsdp1 ws2 full q0.5b bf16 offload (no MixedPrecision)", Q05, dict(method="full", seq=1024,
                                                                               gpus=2, precision="bf16",
                                                                               framework="llamafactory",
                                                                               **OFF, **FSDP), layers=4),
    Case("mg fsdp1 ws8 full l2-7b bf16 offload", L27, dict(method="full", seq=1024, gpus=8, precision="bf16",
                                                           **OFF, **FSDP), layers=4),
    Case("mg fsdp1 ws4 lora l2-7b offload", L27, dict(method="lora", seq=2048, gpus=4, **OFF,
                                                      **FSDP), layers=3),
    Case("mg fsdp1 ws8 lora q0.5b gc offload", Q05, dict(method="lora", seq=1024, gpus=8,
                                                         gradient_checkpointing=True, **OFF,
                                                         **FSDP), layers=4),
    Case("mg fsdp1 ws4 qlora l1b offload", L1, dict(method="qlora", seq=2048, gpus=4, **OFF,
                                                    **FSDP), layers=4),
    Case("mg fsdp1 ws8 qlora l2-7b offload", L27, dict(method="qlora", seq=2048, gpus=8, **OFF,
                                                       **FSDP), layers=3),
    Case("mg fsdp2 ws8 lora l1b", L1, dict(method="lora", seq=2048, gpus=8, **F2), layers=4),
    Case("mg fsdp2 ws2 full l2-7b bf16 offload", L27, dict(method="full", seq=1024, gpus=2, precision="bf16",
                                                           **OFF, **F2), layers=6),
    Case("mg fsdp2 ws4 full q0.5b offload", Q05, dict(method="full", seq=1024, gpus=4, **OFF,
                                                      **F2), layers=4),
    Case("mg fsdp2 ws8 full q0.5b s256 offload (tied head grads)", Q05, dict(method="full", seq=256, gpus=8,
                                                                             **OFF, **F2), layers=6),
    Case("mg fsdp2 ws2 lora q0.5b offload", Q05, dict(method="lora", seq=1024, gpus=2, **OFF,
                                                      **F2), layers=4),
    Case("mg fsdp2 ws4 lora l2-7b gc offload", L27, dict(method="lora", seq=2048, gpus=4,
                                                         gradient_checkpointing=True, **OFF, **F2), layers=3),
    Case("mg fsdp2 ws8 lora l1b offload", L1, dict(method="lora", seq=2048, gpus=8, **OFF, **F2), layers=4),
    Case("mg fsdp2 ws2 qlora q0.5b offload", Q05, dict(method="qlora", seq=1024, gpus=2, **OFF,
                                                       **F2), layers=4, tags=("ci",)),
    Case("mg fsdp2 ws4 qlora l2-7b offload", L27, dict(method="qlora", seq=2048, gpus=4, **OFF,
                                                       **F2), layers=3),
    Case("mg fsdp2 ws8 qlora l1b offload", L1, dict(method="qlora", seq=2048, gpus=8, **OFF, **F2), layers=4),
]
# DeepSpeed ZeRO: DeepSpeed's own engine on a fake process group (needs deepspeed installed; without it these
# cases are left out and the run says so)
ZERO_CASES: list[Case] = [
    Case("mg zero1 ws2 full q0.5b", Q05, dict(method="full", seq=1024, gpus=2, zero=1), layers=4),
    Case("mg zero2 ws4 full q0.5b", Q05, dict(method="full", seq=1024, gpus=4, zero=2), layers=4),
    Case("mg zero2 ws8 full l1b bf16 gc", L1, dict(method="full", seq=1024, gpus=8, zero=2, precision="bf16",
                                                  gradient_checkpointing=True), layers=4),
    Case("mg zero2 ws2 lora q0.5b", Q05, dict(method="lora", seq=1024, gpus=2, zero=2), layers=4),
    Case("mg zero3 ws2 full q0.5b", Q05, dict(method="full", seq=1024, gpus=2, zero=3), layers=4),
    Case("mg zero3 ws4 full l2-7b bf16 gc", L27, dict(method="full", seq=2048, gpus=4, zero=3,
                                                      precision="bf16",
                                                      gradient_checkpointing=True), layers=4),
    Case("mg zero3 ws8 lora l2-7b", L27, dict(method="lora", seq=2048, gpus=8, zero=3), layers=4),
    Case("mg zero3 ws4 qlora q0.5b", Q05, dict(method="qlora", seq=1024, gpus=4, zero=3), layers=4),
    Case("mg zero2 ws2 full q0.5b small buckets", Q05, dict(method="full", seq=1024, gpus=2, zero=2,
                                                           ds_reduce_bucket=10_000_000), layers=4),
    Case("mg zero3 ws2 full q0.5b small buckets", Q05, dict(method="full", seq=1024, gpus=2, zero=3,
                                                           ds_reduce_bucket=10_000_000,
                                                           ds_prefetch_bucket=5_000_000), layers=4),
]
# ZeRO-3 at the loss: the prefetcher's run-ahead keeps what the backward uses, up to
# stage3_max_live_parameters
ZERO_CASES += [
    Case("mg zero3 ws8 full l2-7b bf16 gc 8 layers (max live)", L27, dict(method="full", seq=1024, gpus=8,
                                                                          zero=3, precision="bf16",
                                                                          gradient_checkpointing=True),
         layers=8),
]
# ZeRO-Offload: the optimizer step on the CPU (DeepSpeed's CPU Adam, its compiled kernel's in-place update
# skipped), and with "all" the ZeRO-3 parameter partitions on the CPU; device memory counts what a GPU holds
ZERO_CASES += [
    Case("mg zero1 ws2 full q0.5b offload", Q05, dict(method="full", seq=1024, gpus=2, zero=1,
                                                      offload="optimizer"), layers=4),
    Case("mg zero2 ws4 full q0.5b offload", Q05, dict(method="full", seq=1024, gpus=4, zero=2,
                                                      offload="optimizer"), layers=4),
    Case("mg zero2 ws8 lora q0.5b offload", Q05, dict(method="lora", seq=1024, gpus=8, zero=2,
                                                      offload="optimizer"), layers=4),
    Case("mg zero3 ws2 full q0.5b offload", Q05, dict(method="full", seq=1024, gpus=2, zero=3,
                                                      offload="optimizer"), layers=4),
    Case("mg zero3 ws4 full q0.5b offload all", Q05, dict(method="full", seq=1024, gpus=4, zero=3,
                                                          offload="all"), layers=4),
    Case("mg zero3 ws8 lora l1b offload all gc", L1, dict(method="lora", seq=2048, gpus=8, zero=3,
                                                          offload="all",
                                                          gradient_checkpointing=True), layers=4),
]
MULTI_GPU += ZERO_CASES
CASES += MULTI_GPU


def run_case(case: Case, skip_unsupported: bool = False) -> dict[str, Any]:
    """Both engines on one case; ``skip_unsupported``: a setup the simulation cannot run gives a record with
    ``skipped`` (the simulation's reason) instead of an error."""
    from random_setups import reduced_model
    from tuneplan.api import build_setup
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.memory import memory_breakdown
    from tuneplan.simulate import simulate_report

    spec = reduced_model(case.model, case.layers) if case.layers else resolve_model(case.model)
    setup = build_setup(spec, **case.setup)
    t0 = time.perf_counter()
    rep = simulate_report(spec, setup)
    wall = time.perf_counter() - t0
    if rep.fallback and skip_unsupported:
        return {"label": case.label, "model": spec.name, "setup": case.setup, "skipped": rep.fallback}
    if rep.fallback:
        raise RuntimeError(f"{case.label}: simulate fell back to analytic: {rep.fallback}")
    sim = rep.breakdown
    ana = memory_breakdown(spec, setup)
    sim_peak, ana_peak = sim.allocated_peak_bytes, ana.allocated_peak_bytes
    comps = {k: (sim.components.get(k, 0), ana.components.get(k, 0)) for k in sim.components}
    return {
        "label": case.label, "model": spec.name, "setup": case.setup, "sim_peak": sim_peak,
        "ana_peak": ana_peak,
        "rel": ana_peak / sim_peak - 1, "sim_instant": sim.peak_instant, "ana_instant": ana.peak_instant,
        "peak_op": rep.peak_op,
        "components": {k: {"sim": simulated, "ana": analytic,
                           "diff_pct_of_peak": 100 * (analytic - simulated) / sim_peak}
                       for k, (simulated, analytic) in comps.items() if simulated or analytic},
        "seconds": rep.seconds, "wall": wall, "reserved": sim.reserved_peak_bytes,
        "ana_reserved": ana.reserved_peak_bytes,
        "rel_reserved": ana.reserved_peak_bytes / sim.reserved_peak_bytes - 1,
    }


def _fmt_row(r: dict[str, Any]) -> str:
    worst = max(r["components"].items(), key=lambda kv: abs(kv[1]["diff_pct_of_peak"]))
    return (f"| {r['label']} | {r['sim_peak'] / GIB:.3f} | {r['ana_peak'] / GIB:.3f} | "
            f"{100 * r['rel']:+.2f}% | "
            f"{worst[0]} {worst[1]['diff_pct_of_peak']:+.1f}% | {r['sim_instant']} / {r['ana_instant']} | "
            f"{r['peak_op']} | {r['seconds']:.1f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only the CI subset")
    ap.add_argument("--only", default="", help="cases whose label contains this text")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (2 cores: 2)")
    ap.add_argument("--markdown", action="store_true", help="print only the markdown table and summary")
    ap.add_argument("--json", dest="json_out", default="", help="write the results to this file")
    ap.add_argument("--random", type=int, default=0, metavar="N",
                    help="N random valid setups instead of the cases")
    ap.add_argument("--seed", type=int, default=1, help="the random generator's seed for --random")
    ap.add_argument("--draw", default="", metavar="rN[,rM...]",
                    help="with --random: run only these draws of the seed's sample (r41,r54)")
    args = ap.parse_args(argv)
    if args.random:
        return main_random(args.random, args.seed, args.jobs, args.json_out, args.draw)
    cases = [c for c in CASES if (not args.quick or c.quick) and args.only.lower() in c.label.lower()]
    from tuneplan.simulate.zero import deepspeed_version

    if not deepspeed_version() and any(c in ZERO_CASES for c in cases):
        cases = [c for c in cases if c not in ZERO_CASES]
        print(f"deepspeed is not installed: the {len(ZERO_CASES)} ZeRO cases are left out", file=sys.stderr)
    header = ("| case | simulate GiB | analytic GiB | peak diff | largest component diff (% of peak) | "
              "peak instant sim / analytic | simulated peak op | sim s |\n"
              "|---|---:|---:|---:|---|---|---|---:|")
    stream = not args.markdown  # --markdown: one table in case order at the end
    if stream:
        print(header, flush=True)
    results: list[dict[str, Any]] = []
    if args.jobs > 1 and len(cases) > 1:
        import multiprocessing as mp

        # one fresh process per case: a case's fake-tensor run leaves nothing behind for the next one
        # (isolation; the heap corruption that once killed a long-lived worker was PEFT deep-copying a
        # classifier head's FakeTensorMode, fixed in simulate/build.fake_mode_shared_on_deepcopy)
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn"), max_tasks_per_child=1) as ex:
            futures = [ex.submit(run_case, c) for c in cases]
            for fut in as_completed(futures):
                results.append(fut.result())
                if stream:
                    print(_fmt_row(results[-1]), flush=True)
    else:
        for c in cases:
            results.append(run_case(c))
            if stream:
                print(_fmt_row(results[-1]), flush=True)
    order = {c.label: i for i, c in enumerate(cases)}
    results.sort(key=lambda r: order[r["label"]])
    if not stream:
        print(header)
        for r in results:
            print(_fmt_row(r))
    rels = [abs(r["rel"]) for r in results]
    within = sum(1 for x in rels if x <= 0.03)
    print()
    print(f"cases: {len(results)}; |peak diff| median {100 * statistics.median(rels):.2f}%, "
          f"max {100 * max(rels):.2f}%; within 3%: {within}/{len(results)}; "
          f"simulation seconds per case: median {statistics.median(r['seconds'] for r in results):.1f}, "
          f"max {max(r['seconds'] for r in results):.1f}")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0 if within == len(results) else 1


def main_random(n: int, seed: int, jobs: int, json_out: str, only: str = "") -> int:
    """``--random N``: N valid setups drawn by random_setups.py through both engines (random_agreement.py);
    ``only`` (``r41,r54``) keeps those draws of the same sample, which is drawn in full to reproduce them."""
    import random_agreement
    import random_setups

    rejected = random_setups.Rejections()
    draws = random_setups.sample(n, seed, rejected)
    if only:
        wanted = {int(w.strip().lstrip("r")) for w in only.split(",") if w.strip()}
        draws = [d for d in draws if d.index in wanted]
    print(f"{n} valid setups drawn (seed {seed}; {rejected.total} invalid draws redrawn: "
          + ", ".join(f"{k} {v}" for k, v in rejected.by_field.most_common()) + ")", flush=True)

    def line(r: dict[str, Any]) -> None:
        what = (f"{100 * r['rel']:+7.2f} % (reserved {100 * r['rel_reserved']:+.2f} %)" if "rel" in r else
                "skipped: " + r["skipped"] if "skipped" in r else "failed: " + r["error"])
        print(f"{r['label']}: {what}", flush=True)

    records = random_agreement.run(draws, jobs, each=line)
    summary = random_agreement.summarize(records)
    print()
    print("\n".join(random_agreement.report_lines(summary)))
    if json_out:
        with open(json_out, "w", encoding="utf-8") as f:
            json.dump({"seed": seed, "records": records,
                       "summary": {k: v for k, v in summary.items() if k not in ("worst", "error_records")}},
                      f, indent=1, default=str)
    ok = summary["compared"] and summary["share_within_3pct"] >= 0.95 and not summary["beyond_10pct"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
