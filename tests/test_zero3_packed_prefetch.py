"""ZeRO-3's prefetch beside a decoder layer of 4-bit codes (estimator/wrappers/zero3_packed_prefetch.py)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.memory import resolve_run
from tuneplan.estimator.wrappers.base import layer_gathered_bytes
from tuneplan.estimator.wrappers.zero3_packed_prefetch import zero3_layer_and_prefetch_bytes
from tuneplan.specs.model import model_from_config


def phi2(layers: int) -> dict[str, object]:
    return dict(model_type="phi", hidden_size=2560, num_hidden_layers=layers, num_attention_heads=32,
                intermediate_size=10240, vocab_size=51200, tie_word_embeddings=False,
                partial_rotary_factor=0.4)


def test_the_prefetch_bucket_counts_packed_codes_and_stops_at_the_layers_below() -> None:
    # phi-2 widths: a layer's q, k, v, dense 2560 x 2560 and fc1, fc2 2560 x 10240: 78,643,200 weights,
    # 39,321,600 bytes of 4-bit codes (one uint8 element per two weights, the Params4bit ds_numel) plus
    # their absmax and the 16-bit biases and norm. The bucket of 5e7 elements is 5e7 bytes of codes.
    spec = model_from_config(phi2(2), "phi2-2l")
    run = resolve_run(spec, build_setup(spec, method="qlora", gpus=4, zero=3, gradient_checkpointing=False))
    layer = layer_gathered_bytes(run)
    assert 39_321_600 < layer < 41_000_000
    # 2 layers, no checkpointing: below the top layer the trace holds layer 0 alone (the frozen embedding
    # has no backward use), fewer than 5e7 bytes: one layer more, not 5e7 x 2 bytes
    assert zero3_layer_and_prefetch_bytes(run, 50_000_000) == 2 * layer
    # with checkpointing the 16-bit embedding (51200 x 2560 x 2 bytes) follows in the trace: the whole bucket
    gc = resolve_run(spec, build_setup(spec, method="qlora", gpus=4, zero=3, gradient_checkpointing=True))
    assert zero3_layer_and_prefetch_bytes(gc, 50_000_000) == layer + 50_000_000
    # 3 layers: two below, 2 x layer > 5e7: the whole bucket
    spec3 = model_from_config(phi2(3), "phi2-3l")
    run3 = resolve_run(spec3, build_setup(spec3, method="qlora", gpus=4, zero=3,
                                          gradient_checkpointing=False))
    assert zero3_layer_and_prefetch_bytes(run3, 50_000_000) == layer + 50_000_000


def test_sixteen_bit_layers_take_the_bucket_in_their_compute_dtype() -> None:
    # LoRA in bf16: B elements of 2 bytes beside the layer, 1e8 bytes
    spec = model_from_config(phi2(2), "phi2-2l-lora")
    run = resolve_run(spec, build_setup(spec, method="lora", gpus=4, zero=3, gradient_checkpointing=False))
    assert zero3_layer_and_prefetch_bytes(run, 50_000_000) == layer_gathered_bytes(run) + 100_000_000
