"""Properties that must hold over thousands of random setups (hypothesis)."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tuneplan.api import build_setup, estimate
from tuneplan.estimator.overhead import FRAGMENTATION, SEGMENT
from tuneplan.estimator.wrappers.zero3_coordinator import DS_MAX_LIVE_PARAMETERS
from tuneplan.estimator.wrappers.zero_terms import DS_REDUCE_BUCKET
from tuneplan.specs.model import model_from_config

from .conftest import QWEN25_7B, TINY_LLAMA

MODELS = [model_from_config(QWEN25_7B, "qwen7b"), model_from_config(TINY_LLAMA, "tiny"),
          model_from_config(dict(model_type="mixtral", hidden_size=256, num_hidden_layers=2,
                                 num_attention_heads=8, num_key_value_heads=2, intermediate_size=512,
                                 vocab_size=2000, num_local_experts=4, num_experts_per_tok=2), "tiny-moe"),
          model_from_config(dict(model_type="gemma2", hidden_size=256, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                                 intermediate_size=512, vocab_size=1000),
                            "tiny-gemma2")]

setups = st.fixed_dictionaries({
    "method": st.sampled_from(["full", "freeze", "lora", "qlora"]),
    "precision": st.sampled_from(["bf16-mixed", "bf16", "fp16-mixed", "fp32"]),
    "optimizer": st.sampled_from(["adamw", "adamw-fused", "adamw-8bit", "paged-adamw-8bit", "adafactor",
                                  "sgd"]),
    "batch": st.integers(1, 8), "seq": st.integers(16, 4096), "grad_accum": st.integers(1, 4),
    "gradient_checkpointing": st.booleans(), "attn": st.sampled_from(["eager", "sdpa", "flash"]),
    "framework": st.sampled_from(["hf", "llamafactory", "unsloth", "torchtune", "litgpt"]),
    "rank": st.integers(1, 128), "dropout": st.sampled_from([0.0, 0.05]),
})
model_idx = st.integers(0, len(MODELS) - 1)
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def alloc(m, **kw) -> int:
    return estimate(MODELS[m], **kw).breakdown.allocated_peak_bytes


@SETTINGS
@given(model_idx, setups)
def test_memory_grows_with_batch_and_seq(m, s) -> None:
    base = alloc(m, **s)
    assert alloc(m, **{**s, "batch": s["batch"] + 1}) >= base
    assert alloc(m, **{**s, "seq": s["seq"] + 64}) >= base


@SETTINGS
@given(model_idx, setups)
def test_memory_grows_with_rank(m, s) -> None:
    if s["method"] not in ("lora", "qlora"):
        s = {**s, "method": "lora"}
    # Not with bitsandbytes' 8-bit AdamW on the device: an adapter that grows past min_8bit_size (4,096
    # elements) drops from fp32 to 8-bit states, so its memory can fall (tests/test_estimator_optimizer.py)
    assume(s["optimizer"] != "adamw-8bit")
    assert alloc(m, **{**s, "rank": s["rank"] * 2}) >= alloc(m, **s)


@SETTINGS
@given(model_idx, setups)
def test_more_trainable_params_more_memory(m, s) -> None:
    s = {**s, "method": "lora"}
    # Not under Unsloth: adapting every projection switches its fused LoRA kernels on, which keep less than
    # the unfused path (tests/test_unsloth_profile.py counts both)
    assume(s["framework"] != "unsloth")
    assert alloc(m, **{**s, "targets": "all-linear"}) >= alloc(m, **{**s, "targets": "attn"})
    # more trainable layers under freeze-tuning
    f = {**s, "method": "freeze"}
    assert alloc(m, **{**f, "freeze_trainable_layers": 2}) >= alloc(m, **{**f, "freeze_trainable_layers": 1})


@SETTINGS
@given(model_idx, setups, st.integers(2, 16), st.sampled_from(["full", "lora"]))
def test_zero_stages_order(m, s, gpus, method) -> None:
    # Like for like: DeepSpeed always keeps an fp32 master, so DDP is compared with fp32 master weights too
    # (a pure-bf16 DDP run without master can use less than ZeRO-1 on 2 GPUs: a real effect).
    s = {**s, "method": method, "gpus": gpus, "framework": "hf",
         "precision": "fp32" if s["precision"] == "fp32" else "bf16-mixed"}
    # without accumulation: under it ZeRO-2 keeps the earlier micro-batch's gradient partition (a LoRA run
    # on 2 GPUs can then need a few MB more than ZeRO-1, which reduces only at the boundary); both stages
    # agree with the simulation there (test_zero12_fp32_accumulation_agrees_with_the_simulation below)
    assume(s["grad_accum"] == 1)
    dev = [estimate(MODELS[m], **{**s, "zero": z}).breakdown.device_peak_bytes for z in (0, 1, 2, 3)]
    # ZeRO-2 saves (N-1)/N of the gradients, but reduces in the backward (stage_1_and_2.py reduce hooks):
    # where the activations outweigh the gradients its peak moves to the early backward, where it holds its
    # reduce bucket and its gradient partition beside them, which ZeRO-1, reducing at the end, does not
    # (simulated: Qwen2.5-7B at 2 layers, fp32 full, 1 x 3072 eager, 4 GPUs: ZeRO-2 0.35 GB above
    # ZeRO-1, test_zero2_above_zero1_where_activations_dominate below). At most those two, 4 B each
    trainable = estimate(MODELS[m], **{**s, "zero": 1}).trainable_params
    zero2_backward = 4 * (DS_REDUCE_BUCKET + -(-trainable // gpus))
    assert dev[2] <= dev[1] + zero2_backward * (1 + FRAGMENTATION) + SEGMENT, dev
    # ZeRO-3 keeps its contiguous-gradients bucket and its flat gradient partition for the run (stage3
    # __init__), ZeRO-2 makes them in the backward (setup_buckets .. _release_ipg_buffers): at the loss
    # ZeRO-3 holds g/N more and saves (N-1)/N of the 16-bit weights, so it orders below ZeRO-2 from 3 GPUs,
    # up to the bucket on a model smaller than it (DeepSpeed's engine on a fake process group: tiny
    # Llama, ZeRO-3 +0.03% over ZeRO-2); and at the loss ZeRO-3's prefetcher may hold gathered what the
    # backward uses, up to stage3_max_live_parameters (1e9) plus one parameter's overshoot, in 16 bits
    # (partitioned_param_coordinator.py; simulate: Llama-2-7B layers, the whole model gathered at the loss).
    # Full fine-tunes only: under LoRA, ZeRO-3's memory-efficient linear (runtime/zero/linear.py) also keeps
    # the frozen linears' inputs, activations ZeRO-2 does not hold (simulate: Llama-2-7B LoRA)
    if gpus > 2 and method == "full":
        gathered = 2 * (DS_MAX_LIVE_PARAMETERS + MODELS[m].vocab * MODELS[m].hidden)
        assert dev[3] <= dev[2] + 4 * 500_000_000 + gathered, dev
    # ZeRO's one fixed cost over DDP: the contiguous-gradients bucket, reduce_bucket_size 16-bit (or fp32)
    # elements whatever the model's size (a tiny model can need more under ZeRO-1 than under DDP), reserved
    # with the allocator's fragmentation and segment rounding on top; in an fp32 run ZeRO-1/2 still clone
    # the fp32 master partition (stage_1_and_2.py ``.detach().clone()``), and Adafactor, handed one flat
    # 1-D partition, keeps its second moment unfactored: 4 B per element of the partition each
    bucket = DS_REDUCE_BUCKET * (4 if s["precision"] == "fp32" else 2) * (1 + FRAGMENTATION) + SEGMENT
    partition = 4 * -(-trainable // gpus)
    extra = partition * ((s["precision"] == "fp32") + (s.get("optimizer") == "adafactor"))
    assert dev[1] <= dev[0] + bucket + extra * (1 + FRAGMENTATION) + SEGMENT, dev


@SETTINGS
@given(model_idx, setups)
def test_checkpointing_never_increases_activations(m, s) -> None:
    on = estimate(MODELS[m], **{**s, "gradient_checkpointing": True}).breakdown
    off = estimate(MODELS[m], **{**s, "gradient_checkpointing": False}).breakdown
    from tuneplan.estimator.activations import activation_plan  # noqa: F401  (the quantity below)

    assert on.instants["forward"] <= off.instants["forward"]


@SETTINGS
@given(model_idx, setups)
def test_quantized_weights_order(m, s) -> None:
    # Holds where the quantized block linears dominate (every real LLM). In a toy model whose embeddings
    # outweigh the blocks, PEFT's fp32 upcast of the embeddings can make QLoRA heavier than 16-bit LoRA.
    if MODELS[m].params_linear < 0.7 * MODELS[m].params_total:
        return
    # transformers 5 keeps a MoE's fused experts as 3-D parameters that bitsandbytes does not quantize
    # (only nn.Linear is replaced), and PEFT's kbit preparation upcasts them to fp32: not quantized linears
    if MODELS[m].is_moe:
        return

    def w(**kw):
        c = estimate(MODELS[m], **{**s, **kw}).breakdown.components
        return c["weights"] + c["quant_meta"]

    q4, q8, lora16 = w(method="qlora", bits=4), w(method="qlora", bits=8), w(method="lora", precision="bf16")
    assert q4 < q8 < lora16


@SETTINGS
@given(model_idx, setups)
def test_components_sum_and_ordering(m, s) -> None:
    b = estimate(MODELS[m], **s).breakdown
    assert sum(b.components.values()) == b.allocated_peak_bytes == max(b.instants.values())
    assert all(v >= 0 for v in b.components.values())
    assert b.allocated_peak_bytes <= b.reserved_peak_bytes <= b.device_peak_bytes


# the simulated allocated peaks (benchmarks/random_agreement.run_draw, DeepSpeed 0.19.8 on a fake process
# group): Qwen2.5-7B at 2 layers, full fine-tune in fp32, AdamW, 1 x 16 tokens, 2 micro-batches, 2 GPUs
SIMULATED_ZERO12_FP32_GA2 = {1: 26_982_753_792, 2: 26_101_889_024}


# the simulated allocated peaks (tuneplan.simulate.simulate_report, DeepSpeed 0.19.8 on a fake process
# group): Qwen2.5-7B at 2 layers, full fine-tune in fp32, AdamW, 1 x 3072 tokens, eager attention, no
# checkpointing, no accumulation, 4 GPUs. ZeRO-2 is the higher one: its early backward holds the reduce
# bucket and the gradient partition beside the eager attention's activations
SIMULATED_ZERO12_FP32_LONG = {1: 21_883_381_760, 2: 22_234_664_960}


def test_zero2_above_zero1_where_activations_dominate() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from random_setups import reduced_model
    from tuneplan.estimator.memory import memory_breakdown

    spec = reduced_model("Qwen/Qwen2.5-7B", 2)
    peaks = {}
    for zero, simulated in SIMULATED_ZERO12_FP32_LONG.items():
        setup = build_setup(spec, method="full", precision="fp32", optimizer="adamw", batch=1, seq=3072,
                            grad_accum=1, gradient_checkpointing=False, attn="eager", framework="hf", gpus=4,
                            zero=zero)
        peaks[zero] = memory_breakdown(spec, setup).allocated_peak_bytes
        assert abs(peaks[zero] / simulated - 1) <= 0.03, zero
    assert peaks[2] > peaks[1]


def test_zero12_fp32_accumulation_agrees_with_the_simulation() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from random_setups import reduced_model
    from tuneplan.estimator.memory import memory_breakdown

    spec = reduced_model("Qwen/Qwen2.5-7B", 2)
    for zero, simulated in SIMULATED_ZERO12_FP32_GA2.items():
        setup = build_setup(spec, method="full", precision="fp32", optimizer="adamw", batch=1, seq=16,
                            grad_accum=2, gradient_checkpointing=False, attn="eager", framework="hf", gpus=2,
                            zero=zero)
        assert abs(memory_breakdown(spec, setup).allocated_peak_bytes / simulated - 1) <= 0.03, zero
