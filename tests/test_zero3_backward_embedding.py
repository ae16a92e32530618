"""The backward's round of a QLoRA run's released token embedding, counted by hand from DeepSpeed 0.19.8's
``PartitionedParameterCoordinator`` (estimator/wrappers/zero3_backward_embedding.py)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_backward_embedding import backward_queue, embedding_round_coalesced
from tuneplan.specs.model import model_from_config


def test_the_round_cut_decides_whether_the_embedding_is_popped_with_others() -> None:
    # one layer [a 3e7, b 2e7] under a head of 6e8 (2 x 6e8 >= the 1e9 reuse distance: released); the
    # backward fetches b (its last) first: [2e7, 3e7] = 5e7 fills the bucket, the embedding alone after it
    assert backward_queue([[30_000_000, 20_000_000]], 600_000_000) == [20_000_000, 30_000_000]
    assert not embedding_round_coalesced([[30_000_000, 20_000_000]], 600_000_000, 50_000_000)
    # [1e7, 3e7] = 4e7 < 5e7: the embedding joins that round
    assert embedding_round_coalesced([[30_000_000, 10_000_000]], 600_000_000, 50_000_000)
    # a head of 1e8: 2e8 < 1e9, the bottom layer is kept from its forward, nothing queued before it
    assert not embedding_round_coalesced([[30_000_000, 10_000_000]], 100_000_000, 50_000_000)


def test_an_embedding_popped_by_the_backward_is_held_twice_in_the_bottom_layer() -> None:
    # Qwen2.5-14B over 4 layers, QLoRA fp4 rank 8 on q/v with checkpointing over 4 GPUs in bf16: packed
    # q / o 5120^2 / 2 = 13,107,200, k / v 1024 x 5120 / 2 = 2,621,440, gate / up / down 13824 x 5120 / 2
    # = 35,389,440 (LoRA matrices under 1e5: persistent). The head and the embedding, 152064 x 5120 =
    # 778,567,680 each: the head's two uses (1.557e9) lie between every layer's forward and its recompute,
    # all four released, and the embedding too; the forward's prefetcher stops at the head (the layers and
    # the head past 1e9). In the backward the queue is, per layer top to bottom, down then q k v o gate up,
    # 28 entries, cut at 5e7: [down q k] 51.1e6, [v o gate] 51.1e6, then three times [up down] 70.8e6 and
    # [q k v o gate] 66.8e6, leaving [up_0]: the embedding joins it, waited for at layer 0's recomputed
    # up_proj. Layer 0's backward holds its codes, the flat buffer and the embedding's copy.
    cfg = dict(model_type="qwen2", hidden_size=5120, intermediate_size=13824, num_hidden_layers=4,
               num_attention_heads=40, num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False)
    spec = model_from_config(cfg, "qwen2.5-14b-4L")
    setup = build_setup(spec, method="qlora", precision="bf16-mixed", gpus=4, zero=3, rank=8,
                        targets="q_proj,v_proj", gradient_checkpointing=True, quant_type="fp4")
    run = resolve_run(spec, setup)
    from tuneplan.estimator.wrappers.zero3_quantized_embedding import zero3_quantized_embedding_round

    assert run.dtypes.non_block == 2 and spec.embed_params == 778_567_680
    layer = 2 * 13_107_200 + 2 * 2_621_440 + 3 * 35_389_440  # 137,625,600
    assert zero3_quantized_embedding_round(run, 50_000_000) == (0, layer + 2 * 778_567_680 * 2)
