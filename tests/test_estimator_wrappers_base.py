"""estimator/wrappers/base.py: the helpers every wrapper shares and the sharding wrappers' collectives."""

from __future__ import annotations

import pytest

from tests.conftest import TINY_LLAMA
from tuneplan.estimator.links import Link
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.base import (
    NCCL_BYTES,
    Collectives,
    Resident,
    ShardingWrapper,
    WrapperMemory,
    layer_gathered_bytes,
    nccl_bytes,
    sixteen_bit_wire,
)
from tuneplan.specs.model import model_from_config
from tuneplan.specs.setup import TrainSetup

# one tiny-llama layer: q,o 2 * 256 * 256 + k,v 2 * 256 * 64 + gate,up,down 3 * 256 * 688 + 2 norms * 256
LAYER_PARAMS = 131_072 + 32_768 + 528_384 + 512


def run_of(**kw):
    return resolve_run(model_from_config(TINY_LLAMA, "tiny"), TrainSetup(**kw))


def test_nccl_bytes_only_with_more_than_one_rank():
    assert nccl_bytes(TrainSetup()) == 0
    assert nccl_bytes(TrainSetup(gpus=2)) == NCCL_BYTES
    assert nccl_bytes(TrainSetup(gpus=1, nodes=2)) == NCCL_BYTES
    # naive model parallelism: one process over two cards, no communicator
    assert nccl_bytes(TrainSetup(gpus=2, device_map="auto")) == 0


def test_sixteen_bit_wire():
    assert sixteen_bit_wire(run_of(method="full", precision="bf16")) == 2
    fp32 = run_of(method="full", precision="fp32")
    assert fp32.dtypes.compute == 4
    assert sixteen_bit_wire(fp32) == fp32.param_plan.trainable_bytes == 4


def test_layer_gathered_bytes_of_a_16_bit_layer():
    run = run_of(method="full", precision="bf16")
    assert run.model.largest_layer_params == LAYER_PARAMS
    assert layer_gathered_bytes(run) == LAYER_PARAMS * 2


def test_layer_gathered_bytes_of_a_quantized_layer_is_at_most_its_16_bit_size():
    run = run_of(method="qlora", bits=4)
    gathered = layer_gathered_bytes(run)
    # 4-bit codes are a quarter of 16 bits; the norms and metadata stay well under the other three quarters
    assert LAYER_PARAMS * 2 // 4 <= gathered < LAYER_PARAMS * 2


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_sharding_collectives_by_hand(gpus):
    run = run_of(method="full", precision="bf16", gpus=gpus, fsdp=True)
    link = Link("test", 100.0, "by hand")
    gathered = 1_000_000
    c = ShardingWrapper().collectives(run, grad_bytes=2, gathered_bytes=gathered, link=link)
    ring = (gpus - 1) / gpus  # all-gather and reduce-scatter each send (n - 1) / n of the tensor
    wire = 2 * gathered * ring + run.param_plan.trainable_params * 2 * ring  # forward + backward gathers
    assert c.per_micro_batch == pytest.approx(wire / 100e9)
    assert c.per_step == 0.0


def test_sharding_collectives_none_on_one_gpu():
    run = run_of(method="full", precision="bf16")
    link = Link("test", 100.0, "by hand")
    assert ShardingWrapper().collectives(run, grad_bytes=2, gathered_bytes=10, link=link) == Collectives()


def test_sharding_last_bucket_is_one_16_bit_layer():
    run = run_of(method="full", precision="bf16", gpus=2, fsdp=True)
    assert ShardingWrapper().last_bucket_bytes(run, 2) == LAYER_PARAMS * 2
    assert ShardingWrapper.shards_parameters and ShardingWrapper.shards_optimizer


def test_wrapper_memory_defaults_to_no_buckets_or_gathers():
    mem = WrapperMemory(Resident(1, 2, 3, 4, 5, host=0, nccl=0))
    assert mem.buckets.persistent == mem.buckets.in_layers == mem.buckets.missing_at_bottom == 0
    assert mem.gathered.in_layers == mem.gathered.at_loss == mem.gathered.at_forward_end == 0
    assert mem.top_layer is None and mem.no_sync is None and mem.notes == ()
