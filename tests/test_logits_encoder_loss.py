"""transformers' BertForMaskedLM hands its scores to ``CrossEntropyLoss`` without ``.float()``: under
autocast ``log_softmax`` is on the fp32 list, as for a causal LM; under DeepSpeed, which runs no autocast,
the loss runs in bf16: at the loss backward the saved log-softmax output, the nll gradient and the
log-softmax gradient are three 2-byte tokens x vocabulary tensors (vocabulary 30,522)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.instants import memory_at, named
from tuneplan.estimator.logits import logits_plan
from tuneplan.estimator.run import resolve_run

BERT = "google-bert/bert-large-uncased"
TV = 4 * 256 * 30_522


def test_the_chain_in_the_compute_dtype_when_nothing_upcasts() -> None:
    plan = logits_plan(4 * 256, 30_522, 2, "hf", upcast=False)
    assert (plan.at_forward_end, plan.forward_peak, plan.backward_peak) == (2 * TV, 4 * TV, 6 * TV)
    upcast = logits_plan(4 * 256, 30_522, 2, "hf")
    assert (upcast.at_forward_end, upcast.forward_peak, upcast.backward_peak) == (2 * TV, 10 * TV, 12 * TV)


def test_bert_mlm_loss_backward_is_bf16_under_deepspeed_and_fp32_under_autocast() -> None:
    spec = resolve_model(BERT)

    def loss_backward(**kw) -> int:  # type: ignore[no-untyped-def]
        run = resolve_run(spec, build_setup(spec, method="lora", precision="bf16-mixed", batch=4, seq=256,
                                            **kw))
        return named(memory_at(run, 4, 256).rows["backward_start"]).logits_loss

    assert loss_backward(gpus=2, zero=1) == 6 * TV
    assert loss_backward() == 12 * TV
