"""ZeRO-3's top layers' backward against DeepSpeed 0.19.8's engine (simulate/zero.py, Llama-2-7B cut to 8
layers, ZeRO-3 over 8 GPUs, bf16, checkpointing): figures read off the simulated run, not from the code
under test."""

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.wrappers.zero3_coordinator import DS_MAX_LIVE_PARAMETERS, zero3_gathered_in_backward
from tuneplan.estimator.wrappers.zero3_flush import zero3_bucket_flush
from tuneplan.estimator.wrappers.zero_terms import DS_REDUCE_BUCKET
from tuneplan.specs.model import model_from_config

# the torch.cat reduce_scatter_coalesced made in the simulated backward: the output head (32000 x 4096), the
# final norm, the top layer whole, and the next layer's MLP, post-attention norm and o_proj
SIMULATED_FLUSH = 485_507_072
# the coordinator's __n_available_params through the top two layers' backward (largest value seen)
SIMULATED_TOP_GATHERED = 1_034_000_000


def _l27_8_layers():
    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    cfg = dict(spec.config)
    cfg["num_hidden_layers"] = 8
    spec = model_from_config(cfg, name="l2-7b[8L]")
    return spec, build_setup(spec, method="full", seq=1024, gpus=8, zero=3, precision="bf16",
                             gradient_checkpointing=True)


def test_bucket_flush_matches_deepspeeds_first_reduction() -> None:
    spec, setup = _l27_8_layers()
    filled = zero3_bucket_flush(spec, setup, DS_REDUCE_BUCKET)
    # the analytic order counts a layer's norms after its linears: off by at most one norm (hidden elements)
    assert abs(filled - SIMULATED_FLUSH) <= spec.hidden
    assert filled <= DS_REDUCE_BUCKET


def test_bucket_flush_none_when_everything_fits() -> None:
    spec, setup = _l27_8_layers()
    assert zero3_bucket_flush(spec, setup, spec.params_total + 1) == 0
    lora = build_setup(spec, method="lora", seq=1024, gpus=8, zero=3, precision="bf16")
    assert zero3_bucket_flush(spec, lora, DS_REDUCE_BUCKET) == 0


def test_gathered_in_backward_bounds_the_coordinator() -> None:
    spec, setup = _l27_8_layers()
    bound = zero3_gathered_in_backward(spec, setup)
    # at least what the coordinator held, at most the cap plus one Llama-2-7B MLP projection (4096 x 11008)
    assert SIMULATED_TOP_GATHERED <= bound <= DS_MAX_LIVE_PARAMETERS + 4096 * 11008
