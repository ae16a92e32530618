"""A sequence-classification head (--num-labels) in place of the LM head, counted by hand from
transformers' *ForSequenceClassification modules."""

from __future__ import annotations

import pytest

from tuneplan.api import estimate
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.export import build_export
from tuneplan.specs.profiles import model_as_built
from tuneplan.specs.setup import TrainSetup


def test_bert_classifier_replaces_the_mlm_head() -> None:
    bert = resolve_model("google-bert/bert-large-uncased", allow_network=False)
    h, vocab = 1024, 30522
    clf = model_as_built(bert, "hf", num_labels=2)
    # BertForMaskedLM head: transform (h*h + h) + LayerNorm (2h) + decoder bias (vocab), decoder tied;
    # BertForSequenceClassification: pooler (h*h + h) + classifier (2h + 2)
    assert clf.params_total - bert.params_total == (h * 2 + 2) - (2 * h + vocab)
    assert not clf.tied_embeddings and clf.head_width == 2


def test_decoder_score_head_and_logits() -> None:
    llama = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)
    clf = model_as_built(llama, "hf", num_labels=3)
    assert clf.params_total - llama.params_total == 4096 * 3 - 32000 * 4096  # score (no bias) for lm_head
    lm = estimate(llama, method="lora", batch=2, seq=1024, timing=False).breakdown
    rm = estimate(llama, method="lora", batch=2, seq=1024, num_labels=3, timing=False).breakdown
    # the vocabulary logits chain (12 B per token per vocabulary entry at the loss) is gone
    assert lm.allocated_peak_bytes - rm.allocated_peak_bytes > 2048 * 32000 * 8
    assert rm.components["logits_loss"] < 2048 * 3 * 16


def test_num_labels_is_validated_and_not_exported(tmp_path) -> None:
    llama = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)
    with pytest.raises(TuneplanError) as e:
        estimate(llama, num_labels=0, timing=False)
    assert e.value.field == "num_labels"
    with pytest.raises(TuneplanError) as e:
        build_export("hf-script", estimate(llama, TrainSetup(method="lora", num_labels=2)), tmp_path / "r")
    assert e.value.field == "num_labels"


def test_lora_classifier_trains_the_head_too() -> None:
    # PEFT task SEQ_CLS: modules_to_save keeps the score head trainable (hidden x labels, no bias on Llama)
    llama = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)
    lm = estimate(llama, method="lora", targets="q_proj,v_proj", timing=False).trainable_params
    rm = estimate(llama, method="lora", targets="q_proj,v_proj", num_labels=2, timing=False).trainable_params
    assert rm - lm == 4096 * 2
