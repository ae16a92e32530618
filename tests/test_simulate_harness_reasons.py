"""The simulation's harness: what a checkpointed recomputation runs under, the labels a loop passes, and
the setups the frameworks' own code refuses (reported as such, not as a failed simulation)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import torch  # noqa: E402

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.simulate import simulate_report  # noqa: E402
from tuneplan.simulate.step import training_labels  # noqa: E402


def test_checkpointed_layer_norm_recomputes_under_cuda_autocast_policies() -> None:
    # GPT-2's nn.LayerNorm is on CUDA autocast's fp32 list: the forward saves fp32 tensors, and a GPU
    # recomputation re-enters autocast, so it saves the same; torch.utils.checkpoint refuses any mismatch
    spec = reduced_model("openai-community/gpt2", 2)
    setup = build_setup(spec, method="lora", attn="eager", batch=1, seq=128, gradient_checkpointing=True)
    rep = simulate_report(spec, setup)
    assert rep.fallback == ""


def test_bert_under_fsdp2_is_a_setup_the_real_stack_refuses() -> None:
    # BertEmbeddings is in BERT's _no_split_modules: accelerate makes it a group, then shards the word
    # embeddings inside it again, and fully_shard fails on the DTensor weight
    spec = reduced_model("google-bert/bert-large-uncased", 2)
    setup = build_setup(spec, method="lora", batch=1, seq=128, gpus=2, fsdp=True, fsdp_version=2)
    rep = simulate_report(spec, setup)
    assert rep.fallback.startswith("the real stack cannot run this setup: accelerate's FSDP2 wrapping")


def test_bert_mlm_under_fsdp1_is_a_setup_the_real_stack_refuses() -> None:
    # FSDP1 (PEFT's wrap policy: the _no_split_modules classes) flattens word_embeddings.weight into the
    # BertEmbeddings unit, resharded after its forward; the tied MLM decoder in the root unit then gets
    # the 1-D sharded view (torch FSDP1 _use_sharded_views) and F.linear's mm refuses it ("b must be 2D")
    spec = reduced_model("google-bert/bert-large-uncased", 2)
    setup = build_setup(spec, method="lora", batch=1, seq=64, gpus=2, fsdp=True, fsdp_version=1)
    rep = simulate_report(spec, setup)
    assert rep.fallback.startswith("the real stack cannot run this setup (fsdp1-tied-embeddings-unit)")


def test_training_labels_follow_the_head() -> None:
    ids = torch.zeros((3, 16), dtype=torch.long)
    lm = build_setup(reduced_model("Qwen/Qwen2.5-0.5B", 2), method="lora", batch=3, seq=16)
    assert training_labels(lm, ids) is ids
    classes = build_setup(reduced_model("Qwen/Qwen2.5-0.5B", 2), method="lora", batch=3, seq=16, num_labels=2)
    assert training_labels(classes, ids).shape == (3,) and training_labels(classes, ids).dtype == torch.long
    reward = build_setup(reduced_model("Qwen/Qwen2.5-0.5B", 2), method="lora", batch=3, seq=16, num_labels=1)
    assert training_labels(reward, ids).shape == (3,) and training_labels(reward, ids).dtype == torch.float32


def test_gpt2_conv1d_projections_are_quantized_like_transformers_does() -> None:
    # transformers' replace_with_bnb_linear quantizes a Conv1D as a Linear4bit of its weight's (in, out)
    # shape: GPT-2's c_attn (64 -> 3 x 64), attn c_proj, c_fc (64 -> 4 x 64) and mlp c_proj; lm_head is kept
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.pytorch_utils import Conv1D

    from tuneplan.simulate.qlora import replace_linears

    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=100))
    made = replace_linears(model, torch.bfloat16, False)
    assert not any(isinstance(m, Conv1D) for m in model.modules())
    shapes = sorted((q.in_features, q.out_features) for q in made)
    assert shapes == [(64, 64), (64, 192), (64, 256), (256, 64)]
