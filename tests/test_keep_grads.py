"""keep_grads: torch < 2.0's zero_grad(set_to_none=False) keeps the zeroed gradient buffers allocated
through the next forward, so even without accumulation the step's peak carries every gradient."""

from __future__ import annotations

import pytest

from tuneplan.api import estimate
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.export import build_export
from tuneplan.specs.torch_era import TorchEraSetup

from .conftest import BERT_CLASSIFIER_ARGS, cli_allocated_peak


def test_kept_gradients_join_the_forward_peak() -> None:
    # Qwen2.5-0.5B full fine-tune in fp32, one micro-batch per step: the forward instant holds the same
    # activations with or without kept buffers; kept, it also holds every fp32 gradient (4 B x params)
    spec = resolve_model("Qwen/Qwen2.5-0.5B", allow_network=False)
    kw = dict(method="full", precision="fp32", batch=1, seq=256, timing=False)
    freed = estimate(spec, **kw).breakdown
    kept = estimate(spec, keep_grads=True, **kw).breakdown
    assert freed.components["gradients"] == 0 or freed.peak_instant != "forward"
    assert kept.instants["forward"] - freed.instants["forward"] == 4 * spec.params_total
    # gradient accumulation already keeps them: the switch changes nothing there
    ga = dict(kw, grad_accum=2)
    assert estimate(spec, keep_grads=True, **ga).breakdown.instants == estimate(spec, **ga).breakdown.instants


def test_the_embedding_gradient_is_added_into_its_kept_buffer() -> None:
    # Tied embeddings: the last gradient made is the embedding's. Freed buffers: it becomes .grad, so the
    # bottom layer runs without it. Kept buffers: it is a temporary AccumulateGrad adds into the existing
    # .grad (one more embedding-sized fp32 tensor at that instant, simulate-checked).
    spec = resolve_model("Qwen/Qwen2.5-0.5B", allow_network=False)
    kw = dict(method="full", precision="fp32", batch=1, seq=128, gradient_checkpointing=True, timing=False)
    freed = estimate(spec, **kw).breakdown.instants["backward_embedding"]
    kept = estimate(spec, keep_grads=True, **kw).breakdown.instants["backward_embedding"]
    assert kept - freed == 4 * spec.vocab * spec.hidden


def test_sharded_setups_refuse_the_switch_and_exports_refuse_it(tmp_path) -> None:
    spec = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)
    with pytest.raises(TuneplanError) as e:
        estimate(spec, method="lora", zero=2, gpus=2, keep_grads=True, timing=False)
    assert e.value.field == "keep_grads"
    with pytest.raises(TuneplanError) as e:
        build_export("hf-script", estimate(spec, TorchEraSetup(method="lora", keep_grads=True)),
                     tmp_path / "r")
    assert e.value.field == "keep_grads"


def test_a_calibration_switch_not_a_cli_flag() -> None:
    """Only the calibration rows of torch 1.x stacks set it: the CLI has no such flag (exit 2), and the API
    carries it on a TorchEraSetup (4 B x params of kept fp32 gradients on top of the same run)."""
    from tuneplan.cli.app import run

    assert run(["estimate", *BERT_CLASSIFIER_ARGS, "--keep-grads"]) == 2
    bert = resolve_model("google-bert/bert-large-uncased", allow_network=False)
    kw = dict(method="full", precision="fp32", batch=4, seq=512, attn="eager", num_labels=2, timing=False)
    plain = estimate(bert, **kw).breakdown.allocated_peak_bytes
    assert plain == cli_allocated_peak(*BERT_CLASSIFIER_ARGS)  # the same run as the CLI's
    kept = estimate(bert, TorchEraSetup(keep_grads=True), **kw).breakdown.allocated_peak_bytes
    assert kept > plain + 4 * bert.params_total * 0.9
