"""ZeRO-1/2's flat group made inside ``deepspeed.initialize`` (estimator/wrappers/zero12_flatten.py), by hand
from DeepSpeed 0.19.8's stage_1_and_2.py on four layers of Mistral-7B's widths, untied, a full fp32 run."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.memory import memory_breakdown
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run
from tuneplan.specs.model import model_from_config

MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 4, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32768,
              "tie_word_embeddings": False}
EMBED = 32_768 * 4_096  # the token embedding, and the untied head alike
# q, o; k, v; gate, up, down; the two norms
LAYER = 2 * 4_096 * 4_096 + 2 * 4_096 * 1_024 + 3 * 4_096 * 14_336 + 2 * 4_096
TRAINED = 2 * EMBED + 4 * LAYER + 4_096  # with the final norm


def run(gpus: int, zero: int = 2):  # type: ignore[no-untyped-def]
    model = model_from_config(MISTRAL_7B, "Mistral-7B 4 layers (hand config)")
    setup = build_setup(model, method="full", precision="fp32", gpus=gpus, zero=zero, offload="optimizer",
                        batch=1, seq=64, gradient_checkpointing=False)
    return model, setup, resolve_run(model, setup)


def test_every_parameter_beside_its_flat_copy() -> None:
    # one group of every trained parameter (DeepSpeed's CPU Adam under offload); the module is fp32 on the
    # GPU (4 B each, 4,563,550,208 B), and flatten_dense_tensors_aligned cats them into one buffer of
    # aligned_numel elements, alignment 2 x 4 ranks = 8: 1,140,887,552 is a multiple of 8, no pad
    assert TRAINED == 1_140_887_552 and TRAINED % 8 == 0
    assert memory_statics(run(4)[2]).wrapped.initialize == 4 * TRAINED + 4 * TRAINED
    assert memory_statics(run(4, zero=1)[2]).wrapped.initialize == 8 * TRAINED


def test_the_flat_buffer_is_rounded_up_to_twice_the_ranks() -> None:
    # three ranks: alignment 6; 1,140,887,552 = 6 x 190,147,925 + 2, so aligned_numel adds 4 zero elements
    assert TRAINED % 6 == 2
    assert memory_statics(run(3)[2]).wrapped.initialize == 4 * TRAINED + 4 * (TRAINED + 4)


def test_with_the_optimizer_offloaded_the_flatten_is_above_the_step() -> None:
    # the step holds the fp32 module, the 5e8-element bucket (2 GB) and this rank's gradients, less than a
    # second copy of the module (4.56 GB). The peak is the layers' first reduction, set off by layer 2's
    # gate_proj: the bucket (lm_head, the final norm, layer 3, layer 2's down and up: 469,774,336 elements
    # over ranks 2 and 3's partitions) copied flat beside that gradient, the fp32 bucket and ZeRO-Offload's
    # buffer of the largest parameter (the embedding): 4 x (5e8 + EMBED + 14336 x 4096 + 469,774,336)
    # (simulate: 9,311,465,472 B at that cat, 9,127,101,440 B at the flatten)
    model, setup, resolved = run(4)
    breakdown = memory_breakdown(model, setup)
    assert breakdown.instants["initialize"] > breakdown.instants["optimizer_step"]
    assert breakdown.peak_instant == "backward_reductions"
    bucket = EMBED + 4_096 + LAYER + 2 * 14_336 * 4_096
    assert bucket == 469_774_336
    reduction = 4 * (500_000_000 + EMBED + 14_336 * 4_096 + bucket)
    assert memory_statics(resolved).wrapped.layers_backward == reduction
