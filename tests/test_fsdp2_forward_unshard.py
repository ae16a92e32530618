"""FSDP2's forward copy-outs (wrappers/fully_shard.py): ``FSDPParamGroup.wait_for_unshard`` keeps
the previous group's flat all-gather output (bound to ``prev_all_gather_state``) while it copies a layer's
own out, so a layer's forward starts with three copies: the previous group's flat output, its own and its
unsharded parameters. Sizes by hand, full fine-tune in pure bf16 (2 B per parameter)."""

from __future__ import annotations

from tuneplan.api import build_setup, resolve_run
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.instants import memory_at, named

FSDP2 = dict(method="full", precision="bf16", gpus=2, fsdp=True, fsdp_version=2, seq=512)
# Qwen2.5-0.5B layer: q 896 x 896 + 896 bias, k and v 896 x 128 + 128, o 896 x 896, gate/up/down
# 896 x 4864 each, two norms of 896
QWEN_LAYER = (896 * 896 + 896) + 2 * (896 * 128 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
QWEN_TAIL = 151936 * 896 + 896  # the tied embedding and the final norm: one group
# Llama 2 7B layer: four 4096 x 4096 projections, gate/up/down 4096 x 11008, two norms
LLAMA_LAYER = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096
LLAMA_EMBED = 32000 * 4096  # untied: the input embeddings are a group of their own


def at(model: str):
    spec = resolve_model(model)
    run = resolve_run(spec, build_setup(spec, **FSDP2))
    return memory_at(run, run.setup.batch, run.setup.seq)


def test_tied_tail_is_unsharded_twice_at_the_bottom_layers_copy_out() -> None:
    """Tied: the tail group unsharded at the embeddings (never resharded before the backward) and its flat
    output, beside the bottom layer's two copies; the top layer's forward has the layer below's flat output
    instead of the tail's."""
    m = at("Qwen/Qwen2.5-0.5B")
    assert QWEN_LAYER == 14_912_384
    bottom, top = named(m.rows["forward_layers_bottom"]), named(m.rows["forward_layers_top"])
    assert bottom.parallel_buffers == 2 * (2 * QWEN_TAIL + 2 * QWEN_LAYER)
    assert top.parallel_buffers == 2 * (QWEN_TAIL + 3 * QWEN_LAYER)
    assert bottom.activations == 0
    # every layer below the top has saved its activations; the top one's, the final norm's and the head's
    # are not made yet
    assert 0 < top.activations < named(m.rows["forward"]).activations


def test_untied_embeddings_are_resharded_but_their_flat_output_waits() -> None:
    """Untied (Llama 2 7B): the embedding group reshards after its forward, its flat output waits for the
    bottom layer's copy-out; a 7B layer is larger than the embeddings, so the top layer's three copies are
    the forward's larger unsharded set."""
    m = at("meta-llama/Llama-2-7b-hf")
    assert LLAMA_LAYER == 202_383_360
    bottom, top = named(m.rows["forward_layers_bottom"]), named(m.rows["forward_layers_top"])
    assert bottom.parallel_buffers == 2 * (LLAMA_EMBED + 2 * LLAMA_LAYER)
    assert top.parallel_buffers == 2 * 3 * LLAMA_LAYER
    # the untied head (lm_head and the final norm) copies out beside the top layer's flat output
    head = named(m.rows["forward_head"])
    assert head.parallel_buffers == 2 * (LLAMA_LAYER + 2 * (32000 * 4096 + 4096))
    assert head.activations > top.activations


def test_a_tied_tail_has_no_copy_out_at_the_head() -> None:
    assert "forward_head" not in at("Qwen/Qwen2.5-0.5B").rows


def test_no_forward_copy_out_instants_without_fsdp2() -> None:
    spec = resolve_model("Qwen/Qwen2.5-0.5B")
    for kw in (dict(method="full", gpus=2, fsdp=True, fsdp_version=1), dict(method="lora")):
        run = resolve_run(spec, build_setup(spec, **kw))
        rows = memory_at(run, run.setup.batch, run.setup.seq).rows
        assert not {"forward_layers_bottom", "forward_layers_top", "forward_head"} & set(rows)
