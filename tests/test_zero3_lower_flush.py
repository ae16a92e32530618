"""ZeRO-3's later in-backward reductions of the IPG bucket in a lower layer (estimator/wrappers/
zero3_lower_flush.py), counted by hand from DeepSpeed 0.19.8's stage3.py and coalesced_collectives.py on
an untied Llama of hidden 5120, intermediate 27648, 8 KV heads of 128 and vocab 152064 at 4 layers, full
fine-tune in fp32 over 8 GPUs (the Qwen2.5-32B shape without its biases).

One layer: q and o 5120^2 = 26,214,400 each, k and v 5120 x 1024 = 5,242,880 each, gate, up and down
5120 x 27648 = 141,557,760 each, two norms of 5120: 487,598,080 elements. The head V H = 778,567,680.
Hook order (reduce_buckets.full_backward_gradients): the head, the final norm, then each layer from the
top, down_proj first. Against the 5e8-element bucket: [head] is reduced at the final norm's hook (the
first reduction, zero3_flush.py); [final norm + layer 3] = 487,603,200 at layer 2's down_proj;
[layer 2] = 487,598,080 at layer 1's down_proj; [layer 1] at layer 0's down_proj; [layer 0] waits for
the embedding's hook (the epilogue)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.specs.model import ModelSpec, model_from_config

H, F, V = 5120, 27648, 152064
LAYER = 2 * H * H + 2 * H * 1024 + 3 * H * F + 2 * H  # 487,598,080
HEAD = V * H  # 778,567,680
MLP = H * F  # 141,557,760
BUCKET = 500_000_000


def llama4() -> ModelSpec:
    cfg = dict(model_type="llama", hidden_size=H, num_hidden_layers=4, num_attention_heads=40,
               num_key_value_heads=8, head_dim=128, intermediate_size=F, vocab_size=V,
               tie_word_embeddings=False)
    return model_from_config(cfg, "llama-4L")


def test_the_later_reductions_come_in_the_layers_below_from_down_projs_hook() -> None:
    from tuneplan.estimator.wrappers.zero3_lower_flush import zero3_later_reductions

    spec = llama4()
    assert spec.lm_head_params == HEAD and spec.embed_params == HEAD
    setup = build_setup(spec, method="full", gpus=8, zero=3, precision="fp32")
    placed = [(layer, sum(fill), trigger)
              for layer, fill, trigger in zero3_later_reductions(spec, setup, BUCKET)]
    assert placed == [(2, H + LAYER, MLP), (1, LAYER, MLP), (0, LAYER, MLP)]


def test_a_lower_layers_reduction_copies_its_fill_beside_the_layers_and_embedding_gathered() -> None:
    from tuneplan.estimator.wrappers.zero3_lower_flush import zero3_lower_flush

    spec = llama4()
    # in layer 1 the prefetcher has popped the embedding: layers 0 and 1 hold 975,196,160 < max_live 1e9,
    # gathered with E: 1,753,763,840 elements (layer 2's three layers, 1.46e9, are over it: not popped);
    # the reduction of layer 2's gradients (all divisible by 8: no padding) copies 487,598,080 fp32
    # elements (reduce_scatter_coalesced's torch.cat), down_proj's fp32 gradient (its hook) is live, and
    # with offload_optimizer the norm takes the largest partition, 141,557,760 / 8 = 17,694,720, in fp64
    gathered = 4 * (2 * LAYER + HEAD)
    scratch = 4 * LAYER + 4 * MLP
    off = build_setup(spec, method="full", gpus=8, zero=3, precision="fp32", offload="all")
    assert zero3_lower_flush(spec, off, BUCKET, 4, 0, True) == gathered + scratch + 8 * (MLP // 8)
    assert gathered + scratch + 8 * (MLP // 8) == 9_673_236_480
    plain = build_setup(spec, method="full", gpus=8, zero=3, precision="fp32")
    assert zero3_lower_flush(spec, plain, BUCKET, 4, 0, True) == gathered + scratch
    # the prefetcher not running ahead: the layers' own gathered bytes (given) beside the largest scratch,
    # layer 3's fill with the final norm's gradient
    assert zero3_lower_flush(spec, plain, BUCKET, 4, 10**9, False) == 10**9 + 4 * (H + LAYER) + 4 * MLP


def test_the_reduction_is_an_instant_of_its_own_the_bottom_row_with_its_gathered_and_scratch() -> None:
    from tuneplan.estimator.instants import memory_at
    from tuneplan.estimator.run import resolve_run

    spec = llama4()
    setup = build_setup(spec, method="full", gpus=8, zero=3, precision="fp32", offload="all",
                        gradient_checkpointing=True)
    live = memory_at(resolve_run(spec, setup), 1, 1024)
    row, bottom = live.components("backward_lower_flush"), live.components("backward_layers_bottom")
    assert row["parallel_buffers"] == 9_673_236_480
    # the layer's scratch at down_proj's hook: 1024 tokens x (4 x 5120 + 4 x 27648) (the next test)
    assert row["backward_temp"] == 1024 * 131_072 < bottom["backward_temp"]
    assert {k: v for k, v in row.items() if k not in ("parallel_buffers", "backward_temp")} == {
        k: v for k, v in bottom.items() if k not in ("parallel_buffers", "backward_temp")}


def test_a_checkpointed_bottom_layers_reduction_has_the_embedding_popped_beside_it() -> None:
    from tuneplan.estimator.wrappers.zero3_lower_flush import zero3_lower_flush

    spec = llama4()
    # the prefetcher not running ahead, checkpointed: at the bottom layer's last recomputation fetch the
    # queue up to the embedding holds only layer 0's parameters, AVAILABLE (popped without counting), then
    # the embedding, popped under max_live (layer 0's 487,598,080 < 1e9): layer 1's fill is reduced from
    # layer 0's down_proj hook beside layer 0 and E, 1,266,165,760 fp32 elements gathered
    gc = build_setup(spec, method="full", gpus=8, zero=3, precision="fp32", gradient_checkpointing=True)
    assert zero3_lower_flush(spec, gc, BUCKET, 4, 0, False) == 4 * (LAYER + HEAD) + 4 * LAYER + 4 * MLP
    assert 4 * (LAYER + HEAD) + 4 * LAYER + 4 * MLP == 7_581_286_400
    # without checkpointing the layers are fetched again in the backward's order: no such pop counted
    plain = build_setup(spec, method="full", gpus=8, zero=3, precision="fp32", gradient_checkpointing=False)
    assert zero3_lower_flush(spec, plain, BUCKET, 4, 0, False) == 4 * (H + LAYER) + 4 * MLP


def test_a_reduction_from_its_layers_first_gradient_has_only_down_projs_input_gradient_beside_it() -> None:
    from tuneplan.estimator.dtypes import resolve_dtypes
    from tuneplan.estimator.wrappers.zero3_lower_flush import lower_flush_scratch_per_token
    from tuneplan.specs.profiles import get_profile

    spec = llama4()
    setup = build_setup(spec, method="full", gpus=8, zero=3, precision="fp32")
    dtypes = resolve_dtypes(setup, get_profile(setup.framework))
    assert (dtypes.residual, dtypes.linear_out) == (4, 4)
    # every later reduction comes from a layer's down_proj hook, its first gradient: the residual
    # gradient (h fp32) and down_proj's input gradient (f fp32) a token: 4 x 5120 + 4 x 27648
    assert lower_flush_scratch_per_token(spec, setup, BUCKET, dtypes) == 131_072
    # a 2e8-element bucket: a layer's up_proj (1.4e8) does not fit beside its down_proj, a reduction from
    # inside the layer, after its down_proj's backward: not derived (0, the layer's scratch counted)
    assert lower_flush_scratch_per_token(spec, setup, 200_000_000, dtypes) == 0


def test_the_later_reductions_are_walked_once_per_model_and_kind_not_per_batch_shape() -> None:
    from tuneplan.estimator.wrappers.zero3_lower_flush import later_reductions_walk, zero3_later_reductions

    # the walk reads the model, the kind of backward (full, trained layers, leaf MoE) and the bucket only:
    # a setup of another batch shape gets the same reductions from the kept walk
    spec = llama4()
    first = zero3_later_reductions(spec, build_setup(spec, method="full", gpus=8, zero=3, batch=1), BUCKET)
    hits = later_reductions_walk.cache_info().hits
    again = build_setup(spec, method="full", gpus=8, zero=3, batch=4, seq=4096)
    assert zero3_later_reductions(spec, again, BUCKET) == first
    assert later_reductions_walk.cache_info().hits == hits + 1
