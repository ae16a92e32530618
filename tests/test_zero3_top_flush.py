"""ZeRO-3's first gradient reduction in the top decoder layer, run from that layer's first gradient hook with
the untied head's and the final norm's gradients in the bucket: an instant of its own, what the prefetch
rounds since the head's release gathered, and the layer's scratch then, counted by hand from DeepSpeed
0.19.8 (stage3.py, partitioned_param_coordinator.py, runtime/zero/linear.py; estimator/wrappers/
zero3_head_flush_rounds.py, zero3_flush.py, wrapper_rows.flush_row)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.instants import memory_at
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_coordinator import zero3_gathered_in_backward
from tuneplan.estimator.wrappers.zero3_flush import zero3_flush_mlp_done_scratch, zero3_flush_place
from tuneplan.estimator.wrappers.zero3_head_flush_rounds import zero3_head_norm_flush_params
from tuneplan.specs.model import model_from_config

# Yi-1.5-34B widths: h 7168, 56 heads of 128, 8 KV heads, f 20480, vocab 64000, untied
H, F, V = 7168, 20480, 64000
HEAD = V * H  # 458,752,000
Q = H * H  # q_proj, o_proj: 51,380,224
KV = H * 1024  # k_proj, v_proj: 7,340,032
MLP = H * F  # gate, up, down: 146,800,640
LAYER = 2 * Q + 2 * KV + 3 * MLP + 2 * H  # 557,856,768
BUCKET, PREFETCH = 500_000_000, 50_000_000


def yi(layers: int = 3):  # type: ignore[no-untyped-def]
    base = resolve_model("01-ai/Yi-1.5-34B", allow_network=False)
    return model_from_config(dict(base.config, num_hidden_layers=layers), f"yi-34b-{layers}L")


def full_setup(spec):  # type: ignore[no-untyped-def]
    return build_setup(spec, method="full", precision="bf16-mixed", gpus=4, zero=3, offload="all",
                       gradient_checkpointing=False, batch=1, seq=2048)


def test_the_head_and_norm_fill_holds_what_five_fetch_rounds_since_the_heads_release_gathered() -> None:
    # Backward hooks: the head (458,752,000) and the final norm (7168) fit the 5e8 bucket; the top layer's
    # down_proj (146,800,640) does not: its hook reduces the two first. Reuse distance 1e9 - 2 x head =
    # 82,496,000 > 0: one layer (the top) kept from forward to backward, K = 557,856,768 (its norms
    # persistent). Since the head's release (count K), five module fetches ran before down_proj's hook: the
    # base model, the final norm, the decoder layer, its MLP and down_proj. Each round pops while fewer than
    # min(1e9 - count, 5e7) elements are taken, from the queue after the top layer: layer 1's down, up,
    # gate (146,800,640 each, one a round: counts 704.7e6, 851.5e6, 998.3e6), then min(1.74e6, 5e7):
    # o_proj (51,380,224) -> 1,049,638,912; the fifth finds the count past 1e9 and pops nothing.
    # (simulate: the coordinator's count 1,049,624,576 after the MLP's fetch, unchanged at down_proj's:
    # the same less the kept layer's two norms, 14,336.) Not 1e9 plus the largest parameter, 1,146,800,640:
    # that is the bound with the rounds unlimited.
    spec = yi()
    setup = full_setup(spec)
    assert spec.lm_head_params == HEAD and spec.largest_layer_params == LAYER
    held = LAYER + 3 * MLP + Q
    assert held == 1_049_638_912
    assert zero3_head_norm_flush_params(spec, setup, frozenset(), PREFETCH, BUCKET) == held
    assert zero3_gathered_in_backward(spec, setup) == 1_000_000_000 + MLP
    # a bucket the head, the norm and down_proj fit in: not this reduction
    assert zero3_head_norm_flush_params(spec, setup, frozenset(), PREFETCH, 700_000_000) == -1


def test_the_reduction_from_down_projs_hook_has_its_input_gradient_and_the_residual_gradient_beside() -> None:
    # the reduction comes in the top layer (no layer above), not past its MLP; down_proj's backward returned
    # (LinearFunctionForZeroStage3): live are the residual gradient (h, bf16) and down_proj's input gradient
    # (f, bf16), and autograd released down_proj's saved input, the gated product (f, bf16): 2 x 7168 +
    # 2 x 20480 - 2 x 20480 = 14,336 bytes a token net, not the layer's whole backward scratch
    spec = yi()
    setup = full_setup(spec)
    run = resolve_run(spec, setup)
    assert zero3_flush_place(spec, setup, BUCKET) == (0, False)
    assert zero3_flush_mlp_done_scratch(spec, run.dtypes, BUCKET, setup) == 2 * H


def test_a_reduction_in_the_top_layer_is_an_instant_of_its_own() -> None:
    # The flush's row: the bucket (1e9 bytes) as gradients; activations every saved one but the head's and
    # final norm's (released by their backward); scratch 2048 x 14,336 = 29,360,128; gathered 2 x
    # 1,049,638,912 and the reduction's scratch: reduce_scatter_coalesced's copy of the fill (458,752,000
    # and 7168, both divisible by 4: 2 x 458,759,168), the fp64 norm of the largest partition (458,752,000
    # / 4 = 114,688,000 < 2.5e8: 8 x 114,688,000, its fp32 cast half that) and down_proj's gradient
    # (2 x 146,800,640): 917,518,336 + 917,504,000 + 293,601,280 = 2,128,623,616. The top layer's own row
    # keeps its largest scratch beside what its backward gathers (1e9 and the largest parameter, the rounds
    # unlimited), without the flush's.
    # (simulate: 11,583,462,400 at the partition's fp64 norm, the step's peak; the row here 11,582,321,152
    # with the persistent 33,554,432.)
    spec = yi()
    run = resolve_run(spec, full_setup(spec))
    live = memory_at(run, 1, 2048)
    acts = live.acts
    grads, temp, saved, _, held, scratch, gathered = live.rows["backward_flush"]
    assert grads == 1_000_000_000 and temp == 0 and held == 0
    assert saved == acts.saved_bytes - acts.tail_bytes
    assert scratch == 2048 * 14_336 == 29_360_128
    assert gathered == 2 * 1_049_638_912 + 917_518_336 + 917_504_000 + 293_601_280
    assert live.rows["backward_layers_top"][6] == 2 * (1_000_000_000 + MLP)
