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
from tuneplan.specs.torch_era import TorchEraSetup

from .conftest import BERT_CLASSIFIER_ARGS

BERT_KW = dict(method="full", batch=4, seq=512, attn="eager", gradient_checkpointing=False, num_labels=2,
               timing=False)


def test_eager_attention_keeps_the_scores_of_every_layer() -> None:
    # BERT-large in fp32, no checkpointing: each of 24 layers keeps its B x H x S x S fp32 scores once more
    bert = resolve_model("google-bert/bert-large-uncased", allow_network=False)
    off = estimate(bert, precision="fp32", **BERT_KW).breakdown.components["activations"]
    on = estimate(bert, precision="fp32", softmax_keeps_input=True,
                  **BERT_KW).breakdown.components["activations"]
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


def test_torch_before_1_11_means_eager_attention_and_no_export(tmp_path) -> None:
    # SDPA arrived in torch 2.0 and FlashAttention-2 needs torch >= 1.12: with the switch, attention
    # defaults to eager and an explicit fused kernel is refused
    qwen = resolve_model("Qwen/Qwen2.5-0.5B", allow_network=False)
    est = estimate(qwen, method="lora", seq=256, softmax_keeps_input=True, timing=False)
    assert est.setup.attn == "eager"
    for attn in ("sdpa", "flash"):
        with pytest.raises(TuneplanError) as e:
            estimate(qwen, method="lora", seq=256, attn=attn, softmax_keeps_input=True, timing=False)
        assert e.value.field == "attn"
    with pytest.raises(TuneplanError) as e:
        build_export("hf-script",
                     estimate(qwen, TorchEraSetup(method="lora", attn="eager", softmax_keeps_input=True)),
                     tmp_path / "r")
    assert e.value.field == "softmax_keeps_input"


def test_a_calibration_switch_not_a_cli_flag() -> None:
    from tuneplan.cli.app import run

    assert run(["estimate", *BERT_CLASSIFIER_ARGS, "--softmax-keeps-input"]) == 2
