"""A QLoRA layer under FSDP1 as bitsandbytes and torch make it: the flat parameter gathers the packed codes,
not the quantization state (bnb_scope.sharded_layer_bytes), and the top layer's end holds, after its first
adapter prefetched the layer below, the dequantized weight of its first adapted linear beside the lower
layer's activations, the all-gather's shard freed by then (wrapper_rows.layer_end_dequant).

By hand for Llama-2-70B at 2 layers (hidden 8192, intermediate 28672, 8 KV heads of 128, vocabulary 32000),
QLoRA nf4 without double quantization on the MLP (r128), bf16, fsdp_qlora's train.py on 2 GPUs with CPU
offload, 1 x 384 tokens, no checkpointing:

* one layer's linears: q, o 8192 x 8192, k, v 8192 x 1024, gate, up, down 8192 x 28672: 855,638,016
  elements, packed two a byte: 427,819,008 B, and the two RMSNorms' 2 x 8192 bf16 weights: 32,768 B, so
  FSDP gathers 427,851,776 B a layer (its absmax, 855,638,016 / 64 x 4 = 53,477,376 B, stays a
  ``Params4bit.quant_state`` attribute, whole on every rank);
* use_orig_params=False: the host shard copied to the device, 427,851,776 / 2 = 213,925,888 B, lives only
  while the next layer's all-gather reads it;
* the root unit (embeddings, lm_head 32000 x 8192 each, final norm 8192) unsharded in bf16:
  2 x (2 x 32000 x 8192 + 8192) = 1,048,592,384 B;
* at the prefetch: root + two layers + the shard = 1,048,592,384 + 2 x 427,851,776 + 213,925,888 =
  2,118,221,824 B;
* later, gate_proj's ``MatMul4Bit.backward``: its weight dequantized to bf16, 28672 x 8192 x 2 =
  469,762,048 B, with per token the residual gradient (2 x 8192) and the adapter's and the base's input
  gradients (2 x 2 x 8192): 49,152 B, x 384 = 18,874,368 B; the shard gone: 469,762,048 + 18,874,368 -
  213,925,888 = 274,710,528 B of scratch above the prefetch moment's gathered bytes.
(simulate: fsdp_qlora, this draw: the peak at gate_proj's dequantized matmul, 2,770,370,048 B.)"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.bnb_scope import sharded_layer_bytes  # noqa: E402
from tuneplan.estimator.instants import memory_at, named  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402
from tuneplan.estimator.wrappers.base import layer_gathered_bytes  # noqa: E402

LAYER = 427_851_776
SHARD = 213_925_888
ROOT = 1_048_592_384


def _run():
    spec = reduced_model("meta-llama/Llama-2-70b-hf", 2)
    return resolve_run(spec, build_setup(
        spec, method="qlora", precision="bf16", framework="fsdp-qlora", batch=1, seq=384, grad_accum=1,
        gradient_checkpointing=False, bits=4, quant_type="nf4", double_quant=False, rank=128,
        targets="mlp", dropout=0.05, optimizer="adamw", attn="sdpa", gpus=2, fsdp=True, fsdp_version=1,
        offload="all"))


def test_fsdp_gathers_the_packed_codes_not_bitsandbytes_quant_state() -> None:
    run = _run()
    assert layer_gathered_bytes(run) == 855_638_016 // 2 + 2 * 8192 * 2 == LAYER
    # torchao's NF4 tensors gather their scalers with their codes (another model code than transformers')
    assert sharded_layer_bytes(LAYER, 53_477_376, "torchtune") == LAYER + 53_477_376


def test_prefetch_holds_the_shard_the_all_gather_reads() -> None:
    run = _run()
    gathered = run.wrapper.memory(run, memory_statics(run).optimizer).gathered
    assert gathered.layer_end_transient == SHARD
    assert gathered.layer_end == ROOT + 2 * LAYER + SHARD == 2_118_221_824


def test_top_layer_end_dequantizes_beside_the_lower_layer_once_the_shard_is_freed() -> None:
    run = _run()
    row = named(memory_at(run, 1, 384).rows["backward_top_layer_end"])
    assert row.parallel_buffers == 2_118_221_824
    assert row.backward_temp == 469_762_048 + 384 * (2 * 8192 + 2 * 2 * 8192) - SHARD == 274_710_528


def test_checkpointed_layer_end_dequantizes_beside_the_checkpoints_and_what_the_layer_keeps() -> None:
    # the HF Trainer (use_orig_params=True: the shard copies are held, no transient), Llama-2-70B at 4
    # layers, QLoRA r64 on q_proj / v_proj, fp16-mixed, checkpointing, 1 x 512 tokens, 4 GPUs, CPU offload:
    # q_proj, the first adapted linear, dequantized: 8192 x 8192 x 2 = 134,217,728 B, and per token the
    # residual gradient (2 x 8192) with the adapter's and the base's input gradients (2 x 2 x 8192), x 512 =
    # 25,165,824 B, beside the four layers' checkpoints (4 x 512 x 8192 x 2 = 33,554,432 B) and what the
    # recomputed layer keeps up to q_proj's adapter (ActivationPlan.layer_end_bytes)
    spec = reduced_model("meta-llama/Llama-2-70b-hf", 4)
    run = resolve_run(spec, build_setup(
        spec, method="qlora", precision="fp16-mixed", framework="hf", batch=1, seq=512, grad_accum=1,
        gradient_checkpointing=True, bits=4, quant_type="nf4", double_quant=True, rank=64, attn="flash",
        gpus=4, fsdp=True, fsdp_version=1, offload="all"))
    at = memory_at(run, 1, 512)
    row = named(at.rows["backward_layer_end"])
    assert at.acts.checkpoint_bytes == 4 * 512 * 8192 * 2
    assert row.activations == at.acts.checkpoint_bytes + at.acts.layer_end_bytes
    assert row.backward_temp == 134_217_728 + 512 * (2 * 8192 + 2 * 2 * 8192) == 159_383_552
