"""torchtune mechanisms and the setup fields they brought (loss, compile, activation_offload), each
against a count made by hand from torchtune / torchao / PyTorch behaviour (sources in specs/profiles.py
and estimator/logits.py)."""

from __future__ import annotations

import pytest

from tuneplan.api import estimate
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.estimator.activations import activation_plan
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.estimator.logits import logits_plan
from tuneplan.estimator.quant_kernels import dequant_transient_bytes
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.profiles import get_profile, loss_kind

LLAMA3_8B = "meta-llama/Meta-Llama-3-8B"


def test_legacy_torchtune_loss_chain_by_hand() -> None:
    tokens, vocab = 4096, 1000
    tv = tokens * vocab
    lg = logits_plan(tokens, vocab, 2, "torchtune_legacy")
    assert lg.cast_peak == 2 * tv + 4 * tv  # output(h) in bf16 and its .float()
    assert lg.forward_peak == 4 * tv + 4 * tv  # the fp32 logits and their contiguous shifted copy
    assert lg.held == 4 * tv  # the copy stays bound in the recipe's loop
    # backward: the held copy, the saved fp32 log-softmax, the nll gradient and the log-softmax gradient
    assert lg.backward_peak == 4 * 4 * tv


def test_compiled_chunked_loss_keeps_16_bit_chunks() -> None:
    tokens, vocab = 8192, 1000
    tv = tokens * vocab
    eager = logits_plan(tokens, vocab, 2, "chunked_fp32")
    compiled = logits_plan(tokens, vocab, 2, "chunked_compiled")
    chunk = 4 * tv // 8  # one of 8 chunks in fp32
    assert eager.forward_peak == 2 * tv + 4 * tv + chunk  # bf16 chunks + fp32 log-softmax of each
    assert compiled.forward_peak == 2 * tv + chunk  # only the bf16 chunks are kept
    assert compiled.backward_peak == 2 * tv + chunk


def test_loss_choice_maps_to_a_kernel() -> None:
    spec = resolve_model(LLAMA3_8B, allow_network=False)
    tt = get_profile("torchtune")

    def kind(**kw: object) -> str:
        return loss_kind(estimate(spec, framework="torchtune", timing=False, **kw).setup, tt)

    assert kind() == "chunked_fp32"
    assert kind(loss="upcast") == "hf"
    assert kind(loss="fused") == "fused"
    assert kind(loss="fused-linear") == "fused_linear"
    assert kind(compile=True) == "chunked_compiled"
    assert loss_kind(estimate(spec, framework="hf", loss="chunked", timing=False).setup, get_profile("hf")) \
        == "chunked_fp32"
    with pytest.raises(TuneplanError) as e:
        estimate(spec, loss="liger", timing=False)
    assert e.value.field == "loss"


def test_torchtune_expands_grouped_kv_heads() -> None:
    # Llama-3-8B: 32 query heads, 8 KV heads of 128; torchtune's expand + reshape makes SDPA save K and V
    # with all 32 heads: 2 x (32 - 8) x 128 x 2 bytes more per token per layer than transformers' GQA path
    spec = resolve_model(LLAMA3_8B, allow_network=False)
    s = estimate(spec, framework="torchtune", method="full", batch=1, seq=128, gradient_checkpointing=False,
                 timing=False).setup
    dt = resolve_dtypes(s, get_profile("torchtune"))
    grouped = activation_plan(spec, s, dt, frozenset(), "sdpa", False, False).saved_bytes
    expanded = activation_plan(spec, s, dt, frozenset(), "sdpa", False, False, expand_kv=True).saved_bytes
    assert expanded - grouped == 128 * 32 * 2 * (32 - 8) * 128 * 2


def test_compile_keeps_norm_inputs_in_16_bits_and_recomputes_silu() -> None:
    # per token per layer: two RMSNorms keep their bf16 input (2h) instead of the fp32 upcast (4h), and the
    # SwiGLU product's SiLU output (2 x intermediate) is recomputed; layer 0's attention norm reads frozen
    # embeddings (no gradient) and keeps nothing either way
    spec = resolve_model(LLAMA3_8B, allow_network=False)
    s = estimate(spec, framework="torchtune", method="lora", targets="q_proj,v_proj", batch=1, seq=128,
                 gradient_checkpointing=False, timing=False).setup
    dt = resolve_dtypes(s, get_profile("torchtune"))
    targets = resolve_targets(spec, s.targets)
    eager = activation_plan(spec, s, dt, targets, "sdpa", False, False).saved_bytes
    compiled = activation_plan(spec, s.replace(compile=True), dt, targets, "sdpa", False, False).saved_bytes
    h, inter = 4096, 14336
    per_layer = 2 * (4 - 2) * h + 2 * inter
    assert eager - compiled == 128 * (32 * per_layer - (4 - 2) * h)


def test_activation_offload_keeps_one_layer_on_the_gpu() -> None:
    spec = resolve_model(LLAMA3_8B, allow_network=False)
    s = estimate(spec, framework="torchtune", method="lora", batch=2, seq=512, gradient_checkpointing=False,
                 timing=False).setup
    dt = resolve_dtypes(s, get_profile("torchtune"))
    targets = resolve_targets(spec, s.targets)
    kept = activation_plan(spec, s, dt, targets, "sdpa", False, False)
    off = activation_plan(spec, s.replace(activation_offload=True), dt, targets, "sdpa", False, False)
    final_norm = 1024 * 4 * 4096  # the final norm's fp32 input stays (outside the layers)
    assert off.saved_bytes == final_norm + kept.top_layer_bytes  # one layer's tensors on the GPU at a time
    assert off.offloaded_bytes == kept.saved_bytes - final_norm - kept.top_layer_bytes
    est = estimate(spec, framework="torchtune", method="lora", batch=2, seq=512, gradient_checkpointing=False,
                   activation_offload=True, timing=False)
    assert est.breakdown.host_bytes >= off.offloaded_bytes


def test_compiled_nf4_dequantization_writes_only_the_weight() -> None:
    # torchao get_original_weight: int64 codes of both halves (8 + 8), table lookups and scaling in bf16
    # (2 + 2 + 2 + 2) ... 14 B per element eagerly; fused by torch.compile into the 2-byte bf16 weight.
    spec = resolve_model(LLAMA3_8B, allow_network=False)
    s = estimate(spec, framework="torchtune", method="qlora", timing=False).setup
    largest = 4096 * 14336
    assert dequant_transient_bytes(spec, s, get_profile("torchtune")) == 14 * largest
    assert dequant_transient_bytes(spec, s.replace(compile=True), get_profile("torchtune")) == 2 * largest



def test_fsdp_gathers_a_quantized_layer_as_stored() -> None:
    # Llama-2-7B QLoRA (4-bit NF4, double-quantized scalers, bf16 norms) under FSDP on 2 GPUs: the unit
    # gathered for the current layer and the one prefetched are the layer's packed codes plus metadata
    from dataclasses import replace

    from tuneplan.estimator.optimizer import OptimizerPlan
    from tuneplan.estimator.run import resolve_run

    spec = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)
    s = estimate(spec, framework="torchtune", method="qlora", batch=1, seq=256, fsdp=True, gpus=2,
                 timing=False).setup
    h, inter = 4096, 11008
    layer = 2 * h * 2  # two RMSNorm weights in bf16
    for n in [h * h] * 4 + [h * inter] * 3:
        blocks = n // 64
        # packed codes, a uint8 absmax per block, an fp32 absmax per 256 blocks, the 256-entry fp32 code
        # table and offset, the 16-entry fp32 NF4 code book
        layer += n // 2 + blocks + 4 * -(-blocks // 256) + 256 * 4 + 4 + 16 * 4
    run = resolve_run(spec, s)
    assert run.param_plan.largest_layer_bytes == layer
    no_optimizer = OptimizerPlan(0, 0, 0)
    # torchtune wraps no root unit (profile.fsdp_root_embeddings empty): the two layers alone
    gathered = run.wrapper.memory(run, no_optimizer).gathered
    assert gathered.in_layers == 2 * layer  # not 2 x 16-bit (2 x 404.8 MB)
    # a root unit holding the embeddings, lm_head and final norm stays unsharded (bf16) from the forward on
    root = (2 * 32000 * h + h) * 2
    rooted = replace(run, profile=replace(run.profile, fsdp_root_embeddings=("qlora",)))
    assert rooted.wrapper.memory(rooted, no_optimizer).gathered.in_layers == 2 * layer + root


def test_fused_linear_loss_never_builds_logits() -> None:
    # Liger: chunks of ~tokens x hidden logits (rounded up to a power of two: up to 2x), the input gradient
    # computed in forward (tokens x hidden, 16-bit), an fp32 loss per token; backward keeps the gradient
    tokens, vocab, hidden = 8192, 128256, 4096
    lg = logits_plan(tokens, vocab, 2, "fused_linear", hidden=hidden)
    assert lg.at_forward_end == 0
    assert lg.forward_peak == 2 * tokens * hidden * 3 + 4 * tokens
    assert lg.backward_peak == 2 * tokens * hidden
    assert lg.forward_peak < logits_plan(tokens, vocab, 2, "fused").forward_peak / 10


def test_fp32_logits_need_no_cast() -> None:
    # fp32 training: the model's logits already are fp32, so the loop's cast adds nothing
    tv = 1000 * 100
    assert logits_plan(1000, 100, 4, "torchtune_legacy").cast_peak == 4 * tv
    assert logits_plan(1000, 100, 2, "torchtune_legacy").cast_peak == 2 * tv + 4 * tv
