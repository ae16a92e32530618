"""The LitGPT profile's mechanisms, each against a count made by hand from litgpt / Lightning Fabric /
bitsandbytes behaviour (sources in specs/profiles.py), not against the estimator's own output."""

from __future__ import annotations

import math

from tuneplan.api import estimate
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.activations import activation_plan
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.estimator.logits import logits_plan
from tuneplan.estimator.weights import param_plan
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.profiles import get_profile, model_as_built

GIB = 2**30


def test_litgpt_builds_its_own_lm_head_for_tied_checkpoints() -> None:
    gemma = resolve_model("google/gemma-2b", allow_network=False)
    assert gemma.tied_embeddings
    built = model_as_built(gemma, "litgpt")
    assert not built.tied_embeddings
    assert built.params_total == gemma.params_total + 256000 * 2048
    assert model_as_built(gemma, "hf") is gemma  # transformers keeps the tie
    llama = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)
    assert model_as_built(llama, "litgpt").params_total == llama.params_total


def test_fabric_chunked_loss_by_hand() -> None:
    # 2 x 512 tokens, chunks of 128 along the sequence: n = 4 chunks; tv = tokens x vocab elements
    tokens, vocab = 1024, 1000
    tv = tokens * vocab
    lg = logits_plan(tokens, vocab, 2, "fabric_chunked", seq=512)
    assert lg.at_forward_end == 2 * tv  # bf16 chunks out of lm_head
    assert lg.cast_peak == 2 * tv + 4 * tv  # the bf16 chunks and their fp32 casts (Fabric convert_output)
    assert lg.forward_peak == 4 * tv + 4 * tv  # fp32 chunks + their fp32 log-softmax, kept for backward
    assert lg.held == 4 * tv  # `logits` stays bound in LitGPT's loop
    # last chunk of the loss backward: held fp32 logits + 3 finished fp32 chunk gradients + the chunk in
    # flight (nll gradient, log-softmax gradient, its saved output), each a quarter of 4 tv
    assert lg.backward_peak == 4 * tv + 3 * tv + 3 * tv


def test_fabric_quantizes_the_lm_head_too() -> None:
    spec = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)
    setup = estimate(spec, framework="litgpt", method="qlora", double_quant=False, batch=1, seq=128).setup
    dt = resolve_dtypes(setup, get_profile("litgpt"))
    plain = param_plan(spec, setup, dt)
    fabric = param_plan(spec, setup, dt, quant_lm_head=True)
    vh = 32000 * 4096
    assert plain.weight_bytes - fabric.weight_bytes == vh * 2 - vh // 2  # bf16 head -> packed 4-bit
    # one fp32 absmax per 64-element block plus the 16-entry fp32 NF4 code book
    assert fabric.quant_meta_bytes - plain.quant_meta_bytes == 4 * math.ceil(vh / 64) + 16 * 4


def test_bitsandbytes_pinned_inputs_by_hand() -> None:
    # Llama-2-7B, LitGPT QLoRA on q, v: each layer's 4-bit matmuls keep their inputs in ctx.tensors:
    # qkv reads the attention norm's output (h), proj reads its reshaped copy of the attention output (h),
    # fc_1 and fc_2 share the MLP norm's output (h), the MLP proj reads the gated product (I); plus the
    # 4-bit lm_head's input (h). All bf16. Layer 0's qkv reads the frozen embeddings through a frozen norm:
    # none of its matmul's inputs needs a gradient, no graph node keeps them (-h).
    spec = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)
    est = estimate(spec, framework="litgpt", method="qlora", targets="q_proj,v_proj", batch=2, seq=256)
    setup = est.setup
    dt = resolve_dtypes(setup, get_profile("litgpt"))
    acts = activation_plan(spec, setup, dt, resolve_targets(spec, setup.targets), "sdpa", False, False,
                           quant_saves_input=True, litgpt_code=True, quant_lm_head=True)
    tokens, h, inter = 512, 4096, 11008
    assert acts.pinned_bytes == tokens * ((32 * (3 * h + inter) - h) * 2 + 2 * h)
    # they are still there at the optimizer step, beside the fp32 logits the loop holds
    ph = est.breakdown.instants
    c = est.breakdown.components
    resident = sum(c[k] for k in ("weights", "quant_meta", "lora_adapters", "optimizer_states", "framework"))
    assert ph["optimizer_step"] - resident >= acts.pinned_bytes + 4 * tokens * 32000
    first = estimate(spec, framework="litgpt", method="qlora", targets="q_proj,v_proj", batch=2, seq=256,
                     longest_batch_first=True).breakdown.instants
    # the first batch has no predecessor: its forward loses the previous graph's pinned inputs
    drop = ph["forward"] - first["forward"]
    assert acts.pinned_bytes <= drop <= acts.pinned_bytes + 4 * tokens * 32000


def test_litgpt_lora_dropout_keeps_one_copy_for_the_fused_qkv() -> None:
    # lora_A reads dropout(x): a new bf16 tensor (2h) saved instead of x itself (2h, saved without dropout)
    # plus the bool mask (h) per token; LitGPT's fused qkv LoRA runs one dropout for q and v together, so
    # the difference is one mask per layer (separate q/v modules would keep two copies and two masks), but
    # for the bottom layer, whose normalized input needs no gradient: its dropout records no node, keeps no
    # mask (31 of the 32 layers)
    spec = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)

    def saved(dropout: float) -> int:
        s = estimate(spec, framework="litgpt", method="lora", targets="q_proj,v_proj", batch=1, seq=256,
                     dropout=dropout).setup
        dt = resolve_dtypes(s, get_profile("litgpt"))
        return activation_plan(spec, s, dt, resolve_targets(spec, s.targets), "sdpa", False, False,
                               litgpt_code=True).saved_bytes

    assert saved(0.05) - saved(0.0) == 256 * 31 * 4096


def test_litgpt_partial_qkv_lora_keeps_its_update() -> None:
    # LoRAQKVLinear.zero_pad: with q and v adapted but not k, the (q + v)-wide bf16 update is the source of
    # an index_copy whose backward keeps it; with all three adapted there is no padding and nothing extra
    spec = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)

    def saved(targets: str) -> int:
        s = estimate(spec, framework="litgpt", method="lora", targets=targets, batch=1, seq=256,
                     dropout=0.0).setup
        dt = resolve_dtypes(s, get_profile("litgpt"))
        return activation_plan(spec, s, dt, resolve_targets(spec, s.targets), "sdpa", False, False,
                               litgpt_code=True).saved_bytes

    r = 16  # LoRA rank: lora_A's output (r per adapted projection, bf16) is saved by lora_B's matmul
    partial, full = saved("q_proj,v_proj"), saved("q_proj,k_proj,v_proj")
    # + k's lora_A output, - update
    assert full - partial == 256 * 32 * (r * 2) - 256 * 32 * (4096 + 4096) * 2



def test_litgpt_model_code_has_no_dropout_layers() -> None:
    # phi-2's config asks transformers for residual dropout (resid_pdrop 0.1: a 1-byte mask per element,
    # twice per layer); LitGPT's model code has no dropout layer, so the config's value changes nothing
    from dataclasses import replace

    spec = resolve_model("microsoft/phi-2", allow_network=False)
    no_drop = replace(spec, config={**spec.config, "resid_pdrop": 0.0})
    s = estimate(spec, framework="litgpt", method="lora", targets="q_proj,v_proj", batch=1, seq=128,
                 dropout=0.0, timing=False).setup
    dt = resolve_dtypes(s, get_profile("litgpt"))
    t = resolve_targets(spec, s.targets)

    def saved(m, litgpt: bool) -> int:
        return activation_plan(m, s, dt, t, "sdpa", False, False, litgpt_code=litgpt).saved_bytes

    assert saved(spec, True) == saved(no_drop, True)
    assert saved(spec, False) - saved(no_drop, False) == 128 * 32 * 2 * 2560  # transformers: two masks


def test_parallel_block_mlp_reads_the_attention_input() -> None:
    # phi-2 (one shared LayerNorm, attention and MLP in parallel): LitGPT's 4-bit fc reads the very tensor
    # qkv reads, so the pinned inputs per layer are qkv's (h), proj's reshaped copy (h) and the MLP proj's
    # (I).
    # Layer 0 reads the frozen embeddings: its qkv and its whole MLP need no gradient, so no matmul node
    # keeps their inputs; only proj (after the LoRA-adapted attention) pins its input there.
    spec = resolve_model("microsoft/phi-2", allow_network=False)
    s = estimate(spec, framework="litgpt", method="qlora", targets="q_proj,v_proj", batch=1, seq=256,
                 timing=False).setup
    dt = resolve_dtypes(s, get_profile("litgpt"))
    acts = activation_plan(spec, s, dt, resolve_targets(spec, s.targets), "sdpa", False, False,
                           quant_saves_input=True, litgpt_code=True, quant_lm_head=True)
    h, inter = 2560, 10240
    assert acts.pinned_bytes == 256 * ((31 * (2 * h + inter) + h) * 2 + 2 * h)


def test_litgpt_splits_a_fused_gate_up_into_two_lora_modules() -> None:
    # Phi-3's checkpoint fuses gate_up_proj; LitGPT builds LLaMAMLP with fc_1 and fc_2, each a LoRALinear
    # with its own dropout. LoRA dropout 0.05 vs 0 on every projection, per token per layer (bf16):
    # qkv (one fused dropout: +h for its mask), proj (+h mask), fc_1 and fc_2 (two copies 2 x 2h and two
    # masks 2 x h, instead of the shared input 2h: +4h), MLP proj (+I mask); the bottom layer's qkv
    # dropout reads a normalized input that needs no gradient and keeps no mask (-h once)
    spec = resolve_model("microsoft/Phi-3-mini-4k-instruct", allow_network=False)

    def saved(dropout: float) -> int:
        s = estimate(spec, framework="litgpt", method="lora", targets="all-linear", batch=1, seq=128,
                     dropout=dropout, timing=False).setup
        dt = resolve_dtypes(s, get_profile("litgpt"))
        return activation_plan(spec, s, dt, resolve_targets(spec, s.targets), "sdpa", False, False,
                               litgpt_code=True).saved_bytes

    h, inter = 3072, 8192
    assert saved(0.05) - saved(0.0) == 128 * (32 * (6 * h + inter) - h)


def test_the_micro_batch_after_the_longest_carries_its_leftovers() -> None:
    # lit-gpt 2023 ran the longest sample first: that micro-batch starts with no gradient and nothing held;
    # the next one starts with the accumulated LoRA gradients, the longest batch's fp32 logits (held by the
    # loop) and its bitsandbytes-pinned inputs (held by the graph)
    spec = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)
    b = estimate(spec, framework="litgpt", method="qlora", targets="q_proj,v_proj", rank=16, batch=1, seq=512,
                 grad_accum=4, longest_batch_first=True, timing=False).breakdown
    c = b.components
    resident = sum(c[k] for k in ("weights", "quant_meta", "lora_adapters", "optimizer_states", "framework"))
    h, inter, tokens = 4096, 11008, 512
    lora_grads = 32 * 2 * 16 * (h + h) * 2  # q and v adapters, bf16
    held = 4 * tokens * 32000
    # as in test_bitsandbytes_pinned_inputs_by_hand
    pinned = tokens * ((32 * (3 * h + inter) - h) * 2 + 2 * h)
    assert b.instants["next_micro_batch"] - resident == lora_grads + held + pinned
