"""ZeRO-2's flat copy of a reduction over several ranks' partitions (wrappers/zero12_reductions.py
``flat_copy_elements``) and the head's reduction before any layer's backward (wrappers/zero2_partition.py),
by hand from DeepSpeed 0.19.8's stage_1_and_2.py on a four-layer Llama of Meta-Llama-3-8B's widths over
8 GPUs: ``average_tensor`` cuts the reduced range into one slice per rank's partition,
``allreduce_and_scatter`` groups the slices until one passes ``reduce_bucket_size`` and ``allreduce_bucket``
flattens each group (``cat`` of several slices, a view of a lone one)."""

from __future__ import annotations

import sys
from pathlib import Path

from tuneplan.api import build_setup
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero2_partition import layers_backward_moment
from tuneplan.estimator.wrappers.zero12_reductions import bucket_copy_elements, flat_copy_elements
from tuneplan.specs.model import model_from_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from random_setups import reduced_model  # noqa: E402

LLAMA3_8B_4L = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 4, "num_attention_heads": 32,
                "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
                "tie_word_embeddings": False}
BUCKET = 500_000_000
EMBED = HEAD = 128_256 * 4_096  # 525,336,576 each: the token embedding, the untied lm_head
LAYER = 2 * 4_096 * 4_096 + 2 * 4_096 * 1_024 + 3 * 4_096 * 14_336 + 2 * 4_096
TOTAL = EMBED + 4 * LAYER + 4_096 + HEAD
PARTITION = TOTAL // 8  # 240,390,656: the flat group divides evenly


def test_hand_counts() -> None:
    assert TOTAL == 1_923_125_248 == 8 * PARTITION
    assert PARTITION == 240_390_656


def test_a_range_over_three_partitions_is_copied_whole() -> None:
    # the lm_head, the flat group's last tensor: [1,397,788,672, 8P) is rank 5's last 44,555,264 elements and
    # ranks 6 and 7's 240,390,656 each; 44.6M + 240.4M = 284.9M stays within 5e8, the third slice takes the
    # group to 525,336,576 > 5e8: one group of three slices, one cat of the whole tensor
    assert flat_copy_elements(TOTAL - HEAD, HEAD, PARTITION, BUCKET) == HEAD


def test_a_range_inside_one_partition_is_a_view() -> None:
    assert flat_copy_elements(10, 600_000_000, 1_000_000_000, BUCKET) == 0


def test_slices_past_the_bucket_close_a_group() -> None:
    # three slices of 4e8: the first two pass 5e8 together (a cat of 8e8), the third alone is a view
    assert flat_copy_elements(0, 1_200_000_000, 400_000_000, BUCKET) == 800_000_000


def statics(grad_accum: int):  # type: ignore[no-untyped-def]
    model = model_from_config(LLAMA3_8B_4L, "Llama-3-8B 4 layers (hand config)")
    setup = build_setup(model, method="full", precision="bf16-mixed", optimizer="adamw", gpus=8, zero=2,
                        grad_accum=grad_accum, batch=1, seq=512)
    return memory_statics(resolve_run(model, setup))


def test_the_heads_reduction_holds_its_gradient_and_its_copy() -> None:
    # the lm_head's gradient (bf16), larger than the bucket, waits in its own tensor; the final norm's hook
    # (4,096 elements) reduces it: its 16-bit cat beside both gradients and the 5e8-element bucket (bf16).
    # An accumulating later micro-batch adds the kept grads_in_partition: rank 0's slice lies inside the
    # embedding, held whole (525,336,576 x 2 bytes)
    moment = 2 * (HEAD + 4_096 + HEAD)
    assert statics(1).wrapped.head_backward == 2 * BUCKET + moment
    assert statics(2).wrapped.head_backward == 2 * EMBED + 2 * BUCKET + moment


def test_the_epilogue_copies_the_embedding_over_three_partitions() -> None:
    # [0, EMBED): ranks 0 and 1's 240,390,656 and rank 2's first 44,555,264: one group, one cat
    epilogue = statics(1).wrapped.epilogue
    assert epilogue is not None and epilogue.reduction_copy == 2 * EMBED


def test_slices_merge_in_bucket_order_not_flat_order() -> None:
    # partitions of 100 elements; the bucket holds, in hook order, [250, 280) (rank 2), [390, 395) (rank 3)
    # and [150, 210) (rank 1's 50, rank 2's 10): four slices, 95 elements, one group, one cat of 95. Read as
    # the flat group's range [150, 395) it would be ranks 1, 2 and 3's 50 + 100 + 95 = 245
    assert bucket_copy_elements([(250, 30), (390, 5), (150, 60)], 100, BUCKET) == 95
    # two gradients of rank 1 with a gap between them in the flat group are adjacent in the bucket: one
    # merged slice, a view
    assert bucket_copy_elements([(110, 20), (150, 30)], 100, BUCKET) == 0


def test_a_layers_norms_do_not_widen_the_reduction_copy() -> None:
    # Phi-3-medium at 3 layers, full, bf16, 4 GPUs, ZeRO-2 with the optimizer offloaded (simulate: the second
    # reduction's cat is 471,874,560 elements, the bucket itself). Per layer: qkv_proj 5120 x 7680, o_proj
    # 5120^2, gate_up_proj 35840 x 5120, down_proj 5120 x 17920, two norms of 5120 (one entry here, after
    # the layer's linears in the flat group and in the hooks' order); embedding and lm_head 32064 x 5120
    qkv, o, gate_up, down, norms = 39_321_600, 26_214_400, 183_500_800, 91_750_400, 10_240
    spec = reduced_model("microsoft/Phi-3-medium-4k-instruct", 3)
    run = resolve_run(spec, build_setup(spec, method="full", precision="bf16-mixed", optimizer="adamw-8bit",
                                        gpus=4, zero=2, offload="optimizer", batch=2, seq=384))
    # the first bucket: lm_head, the final norm, layer 2's down, gate_up and o_proj (465,638,400: layer 2's
    # qkv_proj would pass 5e8). The second: layer 2's qkv_proj and norms, layer 1 whole, layer 0's
    # down_proj, reduced as layer 0's gate_up_proj arrives (471,879,680 + 183,500,800 > 5e8). Its range of
    # the flat group, from layer 0's down_proj to layer 2's norms, spans ranks 1, 2 and 3 (partitions of
    # 337,683,200), but in the bucket its slices go to ranks 2, 3, 2, 1, 2, 1, 2, 1: one group, the
    # bucket's 471,879,680 elements copied, beside the arriving gate_up_proj gradient (bf16)
    second = qkv + norms + down + gate_up + o + qkv + norms + down
    assert second == 471_879_680
    walk = layers_backward_moment(run, BUCKET, 0)
    assert walk.moment == 2 * (gate_up + second)
    assert not walk.made
