"""ZeRO-2 with the optimizer offloaded (estimator/wrappers/zero2_partition.py): the reductions in the layers'
backward and their flat copies are the same as without offload, only the partition goes to the host. By
hand from DeepSpeed 0.19.8's stage_1_and_2.py on Mistral-7B at two layers, fp32, over 2 GPUs."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run
from tuneplan.specs.model import model_from_config

MISTRAL_2L = {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
              "tie_word_embeddings": False}
BUCKET = 500_000_000
EMBED = HEAD = 32_000 * 4_096  # 131,072,000
MLP = 14_336 * 4_096  # each of gate, up, down
LAYER = 2 * 4_096 * 4_096 + 2 * 1_024 * 4_096 + 3 * MLP + 2 * 4_096  # 218,112,000


def test_offloaded_reduction_in_the_layers() -> None:
    model = model_from_config(MISTRAL_2L, "Mistral-7B 2 layers (hand config)")
    setup = build_setup(model, method="full", precision="fp32", gpus=2, zero=2, offload="optimizer", batch=1,
                        seq=64)
    wrapped = memory_statics(resolve_run(model, setup)).wrapped
    # the hooks fill the 5e8-element bucket from the top: lm_head and the final norm (131,076,096), layer 1
    # (349,188,096), layer 0's down_proj and up_proj (466,628,608); layer 0's gate_proj would pass 5e8, so
    # its hook reduces the bucket first (reduce_ipg_grads -> average_tensor). Rank 0's partition (the flat
    # group's first 349,186,048 elements: the embedding, layer 0 and 2,048 of layer 1's q_proj) and rank 1's
    # alternate in the bucket (rank 1, then q_proj's two, rank 1, rank 0): several slices in one group,
    # allreduce_bucket's cat of all 466,628,608 elements, beside gate_proj's gradient, the fp32 bucket and
    # ZeRO-Offload's temp_grad_buffer_for_gpu_offload (the largest parameter, the embedding, fp32); no
    # gradient partition on the device (simulate: 4,625,683,456 bytes of them at the peak, the cat)
    assert LAYER == 218_112_000
    copy = HEAD + 4_096 + LAYER + 2 * MLP
    assert copy == 466_628_608
    assert wrapped.layers_backward == 4 * BUCKET + 4 * EMBED + 4 * (MLP + copy) == 4_625_683_456
