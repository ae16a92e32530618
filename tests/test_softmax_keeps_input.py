"""softmax_keeps_input: before torch 1.11 softmax and log_softmax kept their input for backward as well as
their output (derivatives.yaml passed `self` to _softmax_backward_data; pytorch/pytorch#64000, fixed by
#65242 / #66018). Expected bytes below are derived by hand from the tensor shapes."""

from __future__ import annotations

import pytest

from tuneplan.api import estimate
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.estimator.logits import logits_plan
from tuneplan.export import build_export
from tuneplan.specs.setup import TrainSetup

from .conftest import BERT_CLASSIFIER_ARGS, cli_allocated_peak

BERT_KW = dict(method="full", batch=4, seq=512, attn="eager", gradient_checkpointing=False, num_labels=2,
               timing=False)


def test_eager_attention_keeps_the_scores_of_every_layer() -> None:
    # BERT-large in fp32, no checkpointing: each of 24 layers keeps its B x H x S x S fp32 scores once more
    bert = resolve_model("google-bert/bert-large-uncased", allow_network=False)
    off = estimate(bert, precision="fp32", **BERT_KW).breakdown.components["activations"]
    on = estimate(bert, precision="fp32", softmax_keeps_input=True, **BERT_KW).breakdown.components["activations"]
    assert on - off == 24 * 4 * 16 * 512 * 512 * 4  # 1.5 GiB
    # under autocast an unpadded encoder adds no mask: the fp16 scores (2 B) are what softmax reads
    off16 = estimate(bert, precision="fp16-mixed", **BERT_KW).breakdown.components["activations"]
    on16 = estimate(bert, precision="fp16-mixed", softmax_keeps_input=True, **BERT_KW).breakdown.components[
        "activations"]
    assert on16 - off16 == 24 * 4 * 16 * 512 * 512 * 2


def test_the_loss_keeps_its_fp32_logits_until_its_backward() -> None:
    tokens, vocab = 1024, 32_000
    off = logits_plan(tokens, vocab, 2, "hf")
    on = logits_plan(tokens, vocab, 2, "hf", softmax_keeps_input=True)
    assert on.backward_peak - off.backward_peak == 4 * tokens * vocab
    assert (on.at_forward_end, on.forward_peak) == (off.at_forward_end, off.forward_peak)


def test_sdpa_is_untouched_and_exports_refuse_it(tmp_path) -> None:
    qwen = resolve_model("Qwen/Qwen2.5-0.5B", allow_network=False)
    kw = dict(method="lora", seq=256, attn="sdpa", gradient_checkpointing=False, timing=False)
    acts = [estimate(qwen, softmax_keeps_input=v, **kw).breakdown.components["activations"] for v in (0, 1)]
    assert acts[0] == acts[1]  # fused attention has no softmax op of its own
    with pytest.raises(TuneplanError) as e:
        build_export("hf-script", qwen, TrainSetup(method="lora", softmax_keeps_input=True), None, tmp_path / "r")
    assert e.value.field == "softmax_keeps_input"


def test_cli_flag() -> None:
    args = (*BERT_CLASSIFIER_ARGS, "--no-gradient-checkpointing")
    assert cli_allocated_peak(*args, "--softmax-keeps-input") - cli_allocated_peak(*args) == 24 * 4 * 16 * 512 * 512 * 4
