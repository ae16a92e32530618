"""ZeRO-3's prefetcher under a partial fine-tune (estimator/wrappers/zero3_coordinator.py): the backward of
``method=freeze`` stops at the lowest trained layer, so the parameters used again after the forward are the
output head, the final norm and the trained layers (counted by hand on the tiny untied Llama)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.wrappers.zero3_coordinator import zero3_backward_uses, zero3_gathered_ahead
from tuneplan.specs.model import model_from_config

from .sharded_tiny import KV, TINY, A, D, F, H, V

LAYER = H * A * D + 2 * H * KV * D + A * D * H + 3 * H * F + 2 * H  # linears + two RMSNorm weights


def test_freeze_uses_again_the_head_the_norm_and_the_trained_layers() -> None:
    spec = model_from_config(TINY, "tiny-llama-freeze")
    setup = build_setup(spec, method="freeze", freeze_trainable_layers=1, gpus=4, zero=3)
    assert zero3_backward_uses(spec, setup) == V * H + H + LAYER
    # a prefetch bucket of a whole layer per fetch lets the prefetcher run ahead: all of them at the loss
    assert zero3_gathered_ahead(spec, setup, LAYER) == V * H + H + LAYER
