"""ZeRO-3's tied head gathered again in the forward (estimator/wrappers/zero3_tied_head.py), counted by hand
on a tied Llama of gemma-2-27b's widths: embedding ``E = 256000 x 4608 = 1.179648e9`` elements, over
``stage3_max_live_parameters`` (1e9), and two layers of ``4608 (4096 + 2 x 2048) + 4096 x 4608 +
3 x 4608 x 36864 = 566.2e6`` elements each, 1.13e9 between the embedding's forward and the head's, over
``stage3_max_reuse_distance`` (1e9): the embedding is released after its forward and gathered again."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.wrappers.zero3_tied_head import zero3_tied_head_round
from tuneplan.specs.model import model_from_config

H, F, V = 4608, 36864, 256_000
BIG_TIED = dict(model_type="llama", hidden_size=H, num_hidden_layers=2, num_attention_heads=32,
                num_key_value_heads=16, head_dim=128, intermediate_size=F, vocab_size=V,
                tie_word_embeddings=True)
E = V * H
MLP = frozenset({"gate_proj", "up_proj", "down_proj"})


def test_last_lora_factor_coalesces_the_heads_round() -> None:
    spec = model_from_config(BIG_TIED, "big-tied")
    # rank 64: down_proj's lora_B is 4608 x 64 = 294,912 elements, over the 100,000-element persistence
    # threshold: the round is [lora_B, E], its flat buffer E + 294,912 held beside the embedding's copy
    setup = build_setup(spec, method="lora", rank=64, gpus=4, zero=3)
    assert zero3_tied_head_round(spec, setup, MLP) == E + 294_912
    # rank 8: lora_B (36,864) is persistent, lora_A (8 x 36864 = 294,912) precedes the embedding
    setup = build_setup(spec, method="lora", rank=8, gpus=4, zero=3)
    assert zero3_tied_head_round(spec, setup, MLP) == E + 294_912
    # rank 2: both factors persistent (73,728 and 9,216): popped without counting, the embedding alone
    setup = build_setup(spec, method="lora", rank=2, gpus=4, zero=3)
    assert zero3_tied_head_round(spec, setup, MLP) == 0


def test_no_round_when_a_base_linear_precedes_the_head() -> None:
    spec = model_from_config(BIG_TIED, "big-tied")
    # LoRA on the attention only: down_proj's base weight ends its round by its overshoot
    setup = build_setup(spec, method="lora", rank=64, gpus=4, zero=3)
    assert zero3_tied_head_round(spec, setup, frozenset({"q_proj", "v_proj"})) == 0
    # an untied head is zero3_head_round's; one layer (566e6 < 1e9) keeps the embedding gathered
    untied = model_from_config({**BIG_TIED, "tie_word_embeddings": False}, "big-untied")
    lora = build_setup(untied, method="lora", rank=64, gpus=4, zero=3)
    assert zero3_tied_head_round(untied, lora, MLP) == 0
    one = model_from_config({**BIG_TIED, "num_hidden_layers": 1}, "big-tied-1")
    assert zero3_tied_head_round(one, build_setup(one, method="lora", rank=64, gpus=4, zero=3), MLP) == 0
