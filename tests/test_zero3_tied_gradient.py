"""A trained tied head's weight gradient held by autograd's input buffer through ZeRO-3's layers' backward
(estimator/wrappers/zero3_tied_gradient.py), counted by hand from torch's engine and DeepSpeed 0.19.8."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.instants import memory_at, named
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_tied_gradient import zero3_tied_head_gradient
from tuneplan.specs.model import model_from_config

H, VOCAB, LAYERS = 8192, 65024, 3
FALCON = dict(model_type="falcon", hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=128,
              num_kv_heads=8, new_decoder_architecture=True, parallel_attn=True, bias=False,
              multi_query=True, alibi=False, vocab_size=VOCAB)


def test_the_tied_head_gradient_is_held_through_the_layers_backward() -> None:
    # falcon-40b at 3 layers, full fine-tune in bf16 over 2 GPUs: the head's contribution to the shared
    # weight is V x H = 65,024 x 8,192 bf16 = 1,065,353,216 bytes, in the accumulate-grad node's input
    # buffer until the embedding's backward. The layers' rows hold it beside ZeRO-3's persistent gradient
    # terms: the flat bf16 partition (P / 2 ranks x 2 bytes = P bytes, P = V H (embedding)
    # + 3 x 679,510,016 (a layer: qkv 75,497,472 + dense 67,108,864 + two MLP matrices 268,435,456
    # each, two layer norms' weight and bias 4 x 8,192) + 16,384 (ln_f) = 2,571,223,040) and the IPG
    # bucket (reduce_bucket_size 5e8 elements x 2 bytes = 1,000,000,000).
    spec = model_from_config(FALCON, "falcon-3L")
    setup = build_setup(spec, method="full", gpus=2, zero=3, batch=1, seq=64, precision="bf16-mixed")
    held = VOCAB * H * 2
    assert held == 1_065_353_216
    assert zero3_tied_head_gradient(spec, setup, 2) == held
    rows = memory_at(resolve_run(spec, setup), 1, 64).rows
    partition, bucket = 2_571_223_040, 1_000_000_000
    assert named(rows["backward_layers_top"]).gradients == partition + bucket + held
    # not yet at the loss (the head's backward has not run)
    assert named(rows["backward_start"]).gradients == partition + bucket


def test_an_untrained_or_untied_head_holds_nothing() -> None:
    spec = model_from_config(FALCON, "falcon-3L")
    lora = build_setup(spec, method="lora", gpus=2, zero=3)
    assert zero3_tied_head_gradient(spec, lora, 2) == 0
    untied = model_from_config({**FALCON, "tie_word_embeddings": False}, "falcon-3L-untied")
    full = build_setup(untied, method="full", gpus=2, zero=3)
    assert zero3_tied_head_gradient(untied, full, 2) == 0
