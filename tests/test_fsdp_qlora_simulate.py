"""Rank 0 of fsdp_qlora's train.py on the fake process group (simulate/fsdp_qlora.py): FSDP1 wrapped with the
script's own policy and arguments. Expected bytes by hand from the tiny config and FSDP1's sharding rule
(a unit's parameters flattened, padded to a multiple of the world size, rank 0 keeping the first half;
every allocation rounded up to 512 bytes), and from train.py's wrap policy: each LoRA A and B is a unit
of its own (``lambda_policy_fn``: a leaf whose weight requires grad), each decoder layer another."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tuneplan.api import build_setup  # noqa: E402
from tuneplan.simulate import simulate_report  # noqa: E402
from tuneplan.simulate.fsdp_qlora import TRAIN_PY  # noqa: E402
from tuneplan.specs.model import model_from_config  # noqa: E402

from .sharded_tiny import KV, ROPE, TINY, A, D, F, H, L, V, r512  # noqa: E402

pytestmark = pytest.mark.slow  # runs a simulated training step (pyproject.toml markers)

R = 8
# train.py's "all": k, q, v, up, down, gate (no o_proj); (in, out) of each
TARGETS = [(H, KV * D), (H, A * D), (H, KV * D), (H, F), (F, H), (H, F)]
# q k v o gate up down: the 4-bit codes stored in bf16, n / 4 elements per weight
LINEARS = [H * A * D, H * KV * D, H * KV * D, A * D * H, H * F, H * F, F * H]


@pytest.fixture(scope="module")
def runs():
    spec = model_from_config(TINY, "tiny-llama-fsdp-qlora")
    kw = dict(framework="fsdp-qlora", method="qlora", rank=R, seq=64, gpus=2, fsdp=True)
    return (simulate_report(spec, build_setup(spec, **kw)),
            simulate_report(spec, build_setup(spec, offload="all", **kw)))


def test_train_py_wrapper_runs_and_is_named(runs) -> None:
    for rep in runs:
        assert rep.breakdown.engine == "simulate" and not rep.fallback
        assert rep.breakdown.wrapper == TRAIN_PY


def test_each_adapter_matrix_is_its_own_sharded_unit(runs) -> None:
    # one flat parameter per LoRA A (in x r) and B (r x out), bf16 (PEFT gives them the dtype of the
    # bf16-stored base weight), rank 0 keeping half of each
    per_layer = sum(r512(2 * (i * R // 2)) + r512(2 * (R * o // 2)) for i, o in TARGETS)
    assert runs[0].breakdown.components["lora_adapters"] == L * per_layer


def test_layers_and_root_are_sharded_as_stored(runs) -> None:
    layer = sum(k // 4 for k in LINEARS) + 2 * H  # the codes and two bf16 norms
    root = V * H + H + V * H  # embeddings, final norm, lm_head (not quantized), bf16
    expected = L * r512(2 * (layer // 2)) + r512(2 * (root // 2)) + ROPE
    assert runs[0].breakdown.components["weights"] == expected


def test_cpu_offload_moves_shards_and_states_to_the_host(runs) -> None:
    c = runs[1].breakdown.components
    assert c["lora_adapters"] == 0 and c["optimizer_states"] == 0 and c["gradients"] == 0
    assert runs[1].breakdown.host_bytes > runs[0].breakdown.host_bytes
