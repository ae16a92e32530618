"""ZeRO-3's prefetcher (estimator/wrappers/zero3_coordinator.py), counted by hand on the tiny untied Llama:
under ``method=freeze`` the backward stops at the lowest trained layer, so the parameters used again after
the forward are the output head, the final norm and the trained layers; PEFT's LoRA modules are fetch
points of their own."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.wrappers.zero3_coordinator import (
    zero3_backward_uses,
    zero3_gathered_ahead,
    zero3_gathered_at_embedding,
    zero3_head_round,
)
from tuneplan.specs.model import model_from_config

from .sharded_tiny import KV, TINY, A, D, F, H, V

LAYER = H * A * D + 2 * H * KV * D + A * D * H + 3 * H * F + 2 * H  # linears + two RMSNorm weights


def test_freeze_uses_again_the_head_the_norm_and_the_trained_layers() -> None:
    spec = model_from_config(TINY, "tiny-llama-freeze")
    setup = build_setup(spec, method="freeze", freeze_trainable_layers=1, gpus=4, zero=3)
    assert zero3_backward_uses(spec, setup) == V * H + H + LAYER
    # a prefetch bucket of a whole layer per fetch lets the prefetcher run ahead: all of them at the loss
    assert zero3_gathered_ahead(spec, setup, LAYER) == V * H + H + LAYER


def test_peft_modules_are_fetch_points_of_the_prefetcher() -> None:
    # a LoRA linear runs base_layer, dropout, lora_A and lora_B as modules: with q_proj and v_proj
    # targeted a layer has 7 + 2 + 4 + 2 x 4 = 21 fetches instead of 13; a prefetch bucket of 2,000
    # elements then grants 42,000 >= one layer (36,992) per layer, and the prefetcher runs ahead: at the
    # loss it holds what the backward uses, all but the frozen embedding and layer 0's q/k/v
    spec = model_from_config(TINY, "tiny-llama-lora")
    setup = build_setup(spec, method="lora", gpus=4, zero=3, gradient_checkpointing=False)
    assert zero3_gathered_ahead(spec, setup, 2_000) == 0
    used = 2 * LAYER + 2 * V * H + H - V * H - (H * A * D + 2 * H * KV * D)
    assert zero3_gathered_ahead(spec, setup, 2_000, frozenset({"q_proj", "v_proj"})) == used


def test_zero3_embedding_backward_gathers_the_embedding(qwen7b) -> None:
    # the token embedding's pre-backward hook fetches its weight whole, beside the 5e8-element IPG bucket
    # and the flat 16-bit gradient partition (1/N of the trainable parameters, bf16)
    from tuneplan.estimator.memory_statics import memory_statics
    from tuneplan.estimator.run import resolve_run
    from tuneplan.estimator.xp import ceil_div

    setup = build_setup(qwen7b, method="full", precision="bf16-mixed", gpus=4, zero=3)
    run = resolve_run(qwen7b, setup)
    held = memory_statics(run).wrapped.embedding
    assert held is not None and not held.layers_hold_it
    flat = ceil_div(2 * run.param_plan.trainable_params, 4)
    assert held.gradients == 2 * 500_000_000 + flat + 2 * 152_064 * 3_584


def test_the_embedding_forward_holds_what_each_wrapper_fetch_prefetched() -> None:
    # a bucket of 5,000 elements: the first fetch takes the embedding (16,384), each later one pops until it
    # has 5,000 or more: q+k (6,144), v+o (6,144), gate (8,192), up (8,192). A LoRA model has four
    # parameterless wrappers above the embedding (PeftModel, LoraModel, LlamaForCausalLM, LlamaModel) and
    # the embedding's own fetch: five prefetches; a full fine-tune two wrappers, three prefetches
    spec = model_from_config(TINY, "tiny-llama-embedding")
    lora = build_setup(spec, method="lora", gpus=4, zero=3)
    assert zero3_gathered_at_embedding(spec, lora, 5_000) == V * H + 6_144 + 6_144 + 8_192 + 8_192
    full = build_setup(spec, method="full", gpus=4, zero=3)
    assert zero3_gathered_at_embedding(spec, full, 5_000) == V * H + 6_144 + 6_144
    # a bucket past the model's size: the whole model, each parameter once
    assert zero3_gathered_at_embedding(spec, full, 10**7) == 2 * V * H + 2 * (LAYER - 2 * H)


def test_the_head_round_is_held_twice_until_the_head_is_fetched() -> None:
    # the forward trace: embedding 16,384; per layer q 4,096, k 2,048, v 2,048, o 4,096, gate/up/down 8,192;
    # head 16,384. Rounds of at least 30,000: embedding..gate0 (36,864), up0..gate1 (36,864), then up1,
    # down1 and the head (32,768): the round the head shares with the top layer's last two linears
    spec = model_from_config(TINY, "tiny-llama-head")
    assert zero3_head_round(spec, 30_000) == 8_192 + 8_192 + V * H
    # rounds of at least 20,000 end right before the head: a round of its own, gathered without a copy
    assert zero3_head_round(spec, 20_000) == 0
    tied = model_from_config({**TINY, "tie_word_embeddings": True}, "tiny-llama-tied")
    assert zero3_head_round(tied, 30_000) == 0
