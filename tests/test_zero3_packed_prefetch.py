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
    # 2 layers, no checkpointing, LoRA on q and v: below the top layer the trace holds layer 0 alone (the
    # frozen embedding has no backward use), less its linears whose input does not require grad, released
    # after their forward: q, k, v (the layer's input) and fc1, fc2 (phi's MLP reads the same input in
    # parallel), 3 x 6,553,600 + 2 x 26,214,400 = 72,089,600 weights, 36,044,800 bytes of codes, and
    # their 16-bit biases, 3 x 2560 + 10240 + 2560 = 20,480, 40,960 bytes; only dense (its input, the
    # attention core, comes from the adapted q and v) is fetched again: layer - 36,085,760 < 5e7, not
    # 5e7 x 2 bytes
    assert run.targets == frozenset({"q_proj", "v_proj"})
    assert zero3_layer_and_prefetch_bytes(run, 50_000_000) == 2 * layer - 36_085_760
    # with checkpointing the 16-bit embedding (51200 x 2560 x 2 bytes) follows in the trace: the whole bucket
    gc = resolve_run(spec, build_setup(spec, method="qlora", gpus=4, zero=3, gradient_checkpointing=True))
    assert zero3_layer_and_prefetch_bytes(gc, 50_000_000) == layer + 50_000_000
    # 3 layers: two below, 2 x layer - 36,085,760 < 5e7, all of it; 4 layers: 3 x layer - 36,085,760 > 5e7,
    # the whole bucket
    spec2 = model_from_config(phi2(3), "phi2-3l")
    run2 = resolve_run(spec2, build_setup(spec2, method="qlora", gpus=4, zero=3,
                                          gradient_checkpointing=False))
    assert zero3_layer_and_prefetch_bytes(run2, 50_000_000) == 3 * layer - 36_085_760
    spec3 = model_from_config(phi2(4), "phi2-4l")
    run3 = resolve_run(spec3, build_setup(spec3, method="qlora", gpus=4, zero=3,
                                          gradient_checkpointing=False))
    assert zero3_layer_and_prefetch_bytes(run3, 50_000_000) == layer + 50_000_000


def test_sixteen_bit_layers_take_the_bucket_in_their_compute_dtype() -> None:
    # LoRA in bf16: B elements of 2 bytes beside the layer, 1e8 bytes
    spec = model_from_config(phi2(2), "phi2-2l-lora")
    run = resolve_run(spec, build_setup(spec, method="lora", gpus=4, zero=3, gradient_checkpointing=False))
    assert zero3_layer_and_prefetch_bytes(run, 50_000_000) == layer_gathered_bytes(run) + 100_000_000
