"""ZeRO-3 QLoRA's first pass with a complete trace after a record pass that released the persistent
parameters (estimator/wrappers/zero3_record_release.py), counted by hand from DeepSpeed 0.19.8's
defaults: stage3_max_live_parameters M = stage3_max_reuse_distance D = 1e9 elements,
stage3_param_persistence_threshold 1e5, a prefetch bucket of 5e7."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_record_release import zero3_quantized_record_release_copy
from tuneplan.specs.model import model_from_config

GEMMA2_27B = dict(model_type="gemma2", hidden_size=4608, num_hidden_layers=2, num_attention_heads=32,
                  num_key_value_heads=16, head_dim=128, intermediate_size=36864, vocab_size=256_000)


def test_the_embeddings_round_with_the_final_norm_keeps_a_copy_from_the_forward() -> None:
    # gemma-2-27b widths over 2 layers, QLoRA fp4 rank 4 on the MLP with checkpointing and a 1-label head
    # (4,608 elements) in fp16, two micro-batches a step over 8 GPUs. E = 256,000 x 4,608 = 1,179,648,000
    # >= M: the root's fetch pops it, the wrappers and its own fetch nothing, its forward releases it (its
    # backward use lies 3 x 567e6 >= D on). Rounds from the rotary module: per layer [q k v o gate]
    # (packed 9,437,184 + 4,718,592 x 2 + 9,437,184 + 84,934,656), [gate lora_B 147,456, up 84,934,656],
    # [up lora_B, down lora_A, down]: six rounds, 567e6 < M. In the second micro-batch of the first step
    # the record pass has released the final norm (4,608) and the score head (4,608): NOT_AVAILABLE, they
    # open the twelfth round, which pops the embedding too, long before the forward's 49th fetch (the four
    # wrappers, the embedding, per layer the layer, attention, MLP, four attention linears and three LoRA
    # targets of five modules each, at least). The wait at the first of them in the forward copies the
    # embedding; its flat buffer stays to its backward fetch: E x 2 B beside the loss's count.
    spec = model_from_config(GEMMA2_27B, "gemma-2-27b-2L")
    fields = dict(method="qlora", precision="fp16-mixed", gpus=8, zero=3, rank=4, bits=4, quant_type="fp4",
                  targets="mlp", gradient_checkpointing=True, num_labels=1)
    run = resolve_run(spec, build_setup(spec, grad_accum=2, **fields))
    assert run.dtypes.non_block == 2 and run.model.lm_head_params == 4608
    assert zero3_quantized_record_release_copy(run, 50_000_000) == 1_179_648_000 * 2
    # one micro-batch a step: the first complete pass is the second step's, after _post_step gathered the
    # persistent parameters again: the embedding's round is its own
    one = resolve_run(spec, build_setup(spec, grad_accum=1, **fields))
    assert zero3_quantized_record_release_copy(one, 50_000_000) == 0


def test_an_lm_head_closes_the_final_norms_round() -> None:
    # the same layers with a 50,000-token vocabulary and an untied LM head, E = H = 50,000 x 4,608 =
    # 230,400,000 (past the threshold): rounds [E], the six of the layers (567e6; with E 797.8e6 < M),
    # then the queue runs [final norm, head, embedding]: the head (>= the bucket) closes the norm's round
    # and the embedding's round is the embedding alone: no copy from the forward
    spec = model_from_config(dict(GEMMA2_27B, vocab_size=50_000, tie_word_embeddings=False), "gemma-2-2L-50k")
    run = resolve_run(spec, build_setup(spec, method="qlora", precision="fp16-mixed", gpus=8, zero=3, rank=4,
                                        bits=4, quant_type="fp4", targets="mlp", gradient_checkpointing=True,
                                        grad_accum=2))
    assert run.model.lm_head_params == run.model.embed_params == 230_400_000
    assert zero3_quantized_record_release_copy(run, 50_000_000) == 0
