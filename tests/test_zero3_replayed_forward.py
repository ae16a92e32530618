"""A dense QLoRA run under ZeRO-3 with checkpointing: what the replayed coordinator holds at the forward's
4-bit linear where the most is held, beside that linear's dequantized weight, counted by hand from the
simulated step (estimator/wrappers/zero3_head_pop.zero3_replayed_forward_linear)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.instants import memory_at
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_head_pop import zero3_replayed_forward_linear
from tuneplan.specs.model import model_from_config

# Yi-1.5-6B: h 4096, 32 heads of 128, 4 KV heads, f 11008, vocab 64000, untied
H, F, V = 4096, 11008, 64000
E = V * H  # the embedding's and the head's elements: 262,144,000
Q, KV, MLP = H * H // 2, H * 512 // 2, H * F // 2  # nf4 codes, bytes: 8,388,608, 1,048,576, 22,544,384
LAYER = 2 * Q + 2 * KV + 3 * MLP  # 86,507,520 bytes of codes a layer


def run_of(**kw: object):  # type: ignore[no-untyped-def]
    base = resolve_model("01-ai/Yi-1.5-6B", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=4), "yi-6b-4L")
    axes: dict[str, object] = dict(
        method="qlora", precision="bf16-mixed", framework="hf", batch=1, seq=256, grad_accum=2,
        gradient_checkpointing=True, bits=4, quant_type="nf4", double_quant=True, rank=16, targets="attn",
        dropout=0.05, optimizer="adafactor", gpus=4, zero=3, offload="optimizer")
    return resolve_run(spec, build_setup(spec, **{**axes, **kw}))


def test_the_top_layers_up_proj_holds_the_heads_round_twice_the_embedding_and_every_layers_codes() -> None:
    # In the pass with a complete trace the prefetcher runs ahead of the forward (the packed layers are
    # small beside stage3_max_live_parameters): at layer 0's fetch it pops the head (16-bit, V h) in a
    # coalesced round with layer 3's up_proj and down_proj codes, then, the backward's other uses
    # AVAILABLE, the embedding alone at layer 0's input norm (its backward use). At layer 3's up_proj, the
    # round's first wait: its copies are made (the head, 2 E bytes, and the two codes, 2 x 22,544,384)
    # while its flat buffer stays filed under the head until the head's fetch; beside them the embedding
    # (2 E), the four layers' codes (4 x 86,507,520) and up_proj's dequantized weight (h f x 2 and, double
    # quantized, its fp32 absmax, h f / 64 x 4). Three layers' forward ran before it, in the MLP.
    # (simulate: 3,475,597,312 bytes at layer 3's up_proj mm of the second micro-batch, the run's peak:
    # three 5.24e8-byte 16-bit buffers, 3.911e8 bytes of codes, the 9.02e7-byte dequantized weight.)
    run = run_of()
    gathered = 3 * 2 * E + 4 * LAYER + 2 * MLP
    assert gathered == 1_963_982_848
    dequant = H * F * 2 + H * F // 64 * 4
    assert zero3_replayed_forward_linear(run, 50_000_000) == (gathered + dequant, 3, True)
    # the forward row with the bucket (1e9 bytes) and what three layers saved (their checkpoints)
    live = memory_at(run, 1, 256)
    row = live.rows["forward_head_popped"]
    assert row[6] == gathered + dequant and row[0] == 1_000_000_000
    # not a replayed run without checkpointing
    assert zero3_replayed_forward_linear(run_of(gradient_checkpointing=False), 50_000_000) == (0, 0, False)
